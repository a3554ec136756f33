package suite

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferry/broker"
)

// Cluster is the clustered form of a broker, for the failover scenario:
// several nodes of one cluster, of which the scenario kills the one that
// leads the work queue, the partition or the stream.
type Cluster struct {
	// Open connects a new adapter to the cluster (every node's URL), as
	// Target.Open does to the single server. Required.
	Open func(ctx context.Context) (broker.Broker, error)
	// URLs are the nodes' client URLs in node order (node 1 first), each
	// with a host:port (amqp://, nats://, kafka://): the listener of each
	// port is a node whose processes and memory the scenario reports.
	// Required.
	URLs []string
	// Leader returns the node (1..len(URLs)) that leads tp's first queue
	// (internal/cluster.Nodes.Leader). Required.
	Leader func(ctx context.Context, tp broker.Topology) (int, error)
	// Node acts on node n (1..len(URLs)): "kill" sends it SIGKILL,
	// "start" starts it again and returns once it serves. Required.
	Node func(ctx context.Context, n int, action string) error
	// Cleanup, when set, removes what the scenario declared with tp, as
	// Target.Cleanup.
	Cleanup func(ctx context.Context, tp broker.Topology) error
	// Where describes the cluster in the report, e.g. "3 RabbitMQ nodes
	// of compose/local/services.sh's rabbitmq-cluster".
	Where string
	// Close, when set, is called once the scenario is done with the
	// cluster: it stops a cluster that Target.Cluster started.
	Close func()
}

// failoverNodeDownMax is how long the failover scenario keeps the killed
// node down at most while it waits for the pipeline to catch up without
// it.
const failoverNodeDownMax = time.Minute

// failover: producers commit at a steady rate (--rate, else 200/s, as
// the failover tests of internal/cluster) through relay and worker on a
// clustered broker; a quarter in, the node that leads the work queue
// (the partition, the stream) is killed with SIGKILL; once the pipeline
// has caught up without it (at most failoverNodeDownMax) the node is
// started again, and the load goes on until --messages events (at most
// 30 s of them) were committed and 5 s have passed since the restart.
// Figures: the seconds from the kill until publishing resumed (the first
// event committed after the kill confirmed by the broker), until handling
// resumed, until the backlog was drained (recovery); lost events, effects
// applied twice (both must be 0), redeliveries absorbed by the dedup,
// outbox rows charged an attempt; the cluster's processes and resident
// memory.
func (r *runner) failover(ctx context.Context, t Target) ([]Result, error) {
	if t.Cluster == nil {
		return []Result{{Status: statusUnsupported, Note: "no cluster: needs the broker's cluster URLs and a script that kills and starts its nodes (compose/local/services.sh in a ferry checkout; ferry bench --help)"}}, nil
	}
	rt := r.cfg.Rate
	if rt == 0 {
		rt = 200
	}
	n := min(r.cfg.Messages, 30*rt)
	fmt.Fprintf(r.cfg.Progress, "ferry bench: failover %s: getting the cluster…\n", t.Name)
	cl, err := t.Cluster(ctx)
	if err != nil {
		return nil, err
	}
	if cl == nil {
		return []Result{{Status: statusUnsupported, Note: "no cluster of " + t.Name}}, nil
	}
	if cl.Close != nil {
		defer cl.Close()
	}
	r.servers[t.Name+" cluster"] = cl.Where
	ct := Target{Name: t.Name, Open: cl.Open, Cleanup: cl.Cleanup}

	db, err := newDatabase(ctx, r.cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	defer db.close()
	tp := topology()
	defer r.cleanup(ct, tp)
	// The relay's and the worker's logs (each connection lost, each
	// publish retried) go to a file of their own, not to the progress.
	logf, err := os.OpenFile(filepath.Join(r.cfg.Out, "failover-"+t.Name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("bench: failover log: %w", err)
	}
	defer logf.Close()
	log := slog.New(slog.NewTextHandler(logf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	p, err := startPipeline(ctx, ct, db, tp, parts{relay: true, worker: true, workers: r.cfg.Workers}, log)
	if err != nil {
		return nil, err
	}
	defer p.stop()
	pool, err := db.pool(ctx, producers)
	if err != nil {
		return nil, err
	}
	defer pool.Close()

	start := time.Now()
	var (
		committed atomic.Int64
		sent      atomic.Int64
		smu       sync.Mutex
		series    []Point   // seconds since start, events handled
		lags      []float64 // committed minus handled at each point of series
	)
	lagNow := func() int64 { return committed.Load() - sent.Load() }
	pctx, stopProducing := context.WithCancel(ctx)
	defer stopProducing()
	prodErr := make(chan error, 1)
	go func() {
		_, err := produceAll(pctx, pool, 1<<30, producers, rt, r.cfg.Size, func(int64) { committed.Add(1) })
		if pctx.Err() != nil {
			err = nil
		}
		prodErr <- err
	}()
	sctx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			c := committed.Load()
			if s, err := db.countSent(sctx); err == nil {
				sent.Store(s)
				smu.Lock()
				series = append(series, Point{X: time.Since(start).Seconds(), Y: float64(s)})
				lags = append(lags, float64(c-s))
				smu.Unlock()
			}
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
		}
	}()

	b := r.newBar("failover "+t.Name, n)
	progress := func() { b.update(sent.Load()) }
	slack := int64(max(rt/4, 5))
	// A quarter in, with the pipeline caught up: find the leader, kill it.
	_ = waitFor(ctx, time.Minute, func() bool { return committed.Load() >= int64(n/4) }, progress)
	_ = waitFor(ctx, 30*time.Second, func() bool { return lagNow() <= slack }, progress)
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	leader, err := cl.Leader(lctx, tp)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("bench: the leader of %s: %w", tp.Queues[0].Name, err)
	}
	if err := cl.Node(ctx, leader, "kill"); err != nil {
		return nil, fmt.Errorf("bench: kill node %d: %w", leader, err)
	}
	// The node is gone once the script returned (it sends SIGKILL): what
	// is committed from now on needs the failover.
	killAt := time.Since(start)
	killTime := time.Now()
	// The node stays down until the pipeline caught up without it: an
	// event committed after the kill handled, and the lag back under the
	// slack.
	handledSince := func() bool {
		var ok bool
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		err := db.admin.QueryRow(qctx, `SELECT EXISTS (SELECT FROM notifications WHERE created_at > $1 AND status = 'sent')`, killTime).Scan(&ok)
		return err == nil && ok
	}
	down := waitFor(ctx, failoverNodeDownMax, func() bool { return lagNow() <= slack && handledSince() }, progress)
	restartAt := time.Since(start)
	if err := cl.Node(ctx, leader, "start"); err != nil {
		return nil, fmt.Errorf("bench: start node %d again: %w", leader, err)
	}
	restartTook := time.Since(start) - restartAt
	restarted := time.Now()
	_ = waitFor(ctx, 10*time.Minute, func() bool {
		return committed.Load() >= int64(n) && time.Since(restarted) >= 5*time.Second
	}, progress)
	stopProducing()
	perr := <-prodErr
	// Every committed event handled: counted in the database on every poll,
	// since a commit cut short by the stop may still land.
	var total int64
	countAll := func() int64 {
		if err := db.admin.QueryRow(ctx, `SELECT count(*) FROM notifications`).Scan(&total); err == nil {
			committed.Store(total)
			b.setTotal(total)
		}
		return total
	}
	countAll()
	drained := waitFor(ctx, 2*time.Minute, func() bool { return sent.Load() >= countAll() }, progress)
	stopSampling()
	<-sampled
	b.finish(sent.Load())
	if perr != nil {
		return nil, perr
	}
	// The cluster at the end, all nodes up: what running it takes.
	ops := clusterOps(t.Name+" cluster", cl.URLs)
	r.clusterOps = append(r.clusterOps, ops)
	if err := p.stop(); err != nil {
		r.log.Warn("bench: failover: relay or worker stopped with an error", "broker", t.Name, "error", err)
	}

	out := Result{Seconds: time.Since(start).Seconds(), Variant: "kill -9 the leader"}
	var handled, twice, charged, workerAttempts int64
	var publishResumed, handlingResumed *float64
	q := db.admin.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM notifications),
		(SELECT count(*) FROM notifications WHERE status = 'sent'),
		(SELECT count(*) FROM notifications WHERE attempts > 1),
		(SELECT count(*) FROM outbox WHERE attempts > 0),
		(SELECT count(*) FROM worker_attempts),
		(SELECT extract(epoch FROM min(processed_at) - $1) FROM outbox WHERE occurred_at > $1),
		(SELECT extract(epoch FROM min(sent_at) - $1) FROM notifications WHERE created_at > $1)`, killTime)
	if err := q.Scan(&total, &handled, &twice, &charged, &workerAttempts, &publishResumed, &handlingResumed); err != nil {
		return nil, fmt.Errorf("bench: failover counts: %w", err)
	}
	out.Messages = int(total)
	// The series: the lag (committed minus handled) in seconds since the
	// kill, for the chart.
	smu.Lock()
	rec := recovery(series, lags, killAt.Seconds(), float64(slack))
	for i := range series {
		out.Series = append(out.Series, Point{X: series[i].X - killAt.Seconds(), Y: lags[i]})
	}
	smu.Unlock()
	orMinus := func(v *float64) float64 {
		if v == nil {
			return -1
		}
		return *v
	}
	out.add("publish resumed", orMinus(publishResumed), "s")
	out.add("handling resumed", orMinus(handlingResumed), "s")
	out.add("backlog drained", rec, "s")
	out.add("node restart", restartTook.Seconds(), "s")
	out.add("lost", float64(total-handled), "")
	out.add("effects applied twice", float64(twice), "")
	out.add("duplicates absorbed", float64(p.dups.Load()), "")
	out.add("outbox rows charged", float64(charged), "")
	out.add("worker attempts recorded", float64(workerAttempts), "")
	out.add("cluster processes", float64(ops.Processes), "")
	out.add("cluster memory", float64(ops.RSSBytes)/(1<<20), "MiB")
	out.Note = fmt.Sprintf("%d events at %d/s on %d nodes; node %d (the leader) killed at %s, started again at %s (down %s)", total, rt, len(cl.URLs), leader,
		FormatSeconds(killAt.Seconds()), FormatSeconds(restartAt.Seconds()), FormatSeconds((restartAt - killAt).Seconds()))
	if slices.ContainsFunc(out.Figures, func(f Figure) bool { return f.Unit == "s" && f.Value < 0 }) {
		out.Note += "; -1 s: it never happened"
	}
	if down != nil {
		out.Note += fmt.Sprintf("; the pipeline had not caught up within %v of the kill", failoverNodeDownMax)
	}
	if drained != nil {
		out.Status = statusFailed
		out.Note = fmt.Sprintf("%v: %d of %d handled; %s", drained, handled, total, out.Note)
	}
	return []Result{out}, nil
}

// clusterOps adds up serverOps of every node: the listener of each URL's
// port and its process tree.
func clusterOps(name string, urls []string) Operations {
	sum := Operations{Name: name}
	var notes []string
	for i, u := range urls {
		op := serverOps(name, u)
		if op.Note != "" {
			notes = append(notes, fmt.Sprintf("node %d: %s", i+1, op.Note))
		}
		sum.Processes += op.Processes
		sum.RSSBytes += op.RSSBytes
		for _, c := range op.Commands {
			if !slices.Contains(sum.Commands, c) {
				sum.Commands = append(sum.Commands, c)
			}
		}
	}
	sum.Note = fmt.Sprintf("%d nodes", len(urls))
	if len(notes) > 0 {
		sum.Note += "; " + fmt.Sprint(notes)
	}
	return sum
}
