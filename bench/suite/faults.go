package suite

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// Child roles of the faults scenario.
const (
	RoleRelay  = "relay"
	RoleWorker = "worker"
)

// ChildConfig configures RunChild: a relay or a worker of the faults
// scenario, running as a child process of ferry bench so that it can be
// killed with SIGKILL.
type ChildConfig struct {
	// Role is RoleRelay or RoleWorker. Required.
	Role string
	// DatabaseURL is the scenario's database. Required.
	DatabaseURL string
	// Exchange names the scenario's topology (see topologyNamed). Required.
	Exchange string
	// Open connects the broker. Required.
	Open func(ctx context.Context) (broker.Broker, error)
	// Workers is the worker's Concurrency. Defaults to 20.
	Workers int
	// Logger receives the relay's or worker's logs. Defaults to
	// slog.Default().
	Logger *slog.Logger
	// StatsFile, when set, is where the child writes its ChildStats as
	// JSON every second (written to a temporary file and renamed, so a
	// reader never sees half of it): the soak scenario reads the heap and
	// goroutines of its children there. Empty: no stats.
	StatsFile string
}

// ChildStats is what a child process reports of itself in
// ChildConfig.StatsFile.
type ChildStats struct {
	// PID is the child's process id: a reader tells a new child's stats
	// from a killed one's left in the file.
	PID int `json:"pid"`
	// HeapInuse is runtime.MemStats.HeapInuse, in bytes.
	HeapInuse uint64 `json:"heap_inuse"`
	// Goroutines is runtime.NumGoroutine().
	Goroutines int `json:"goroutines"`
	// At is when the figures were read.
	At time.Time `json:"at"`
}

// writeStats writes the process's ChildStats to path every second until
// ctx is done; a failed write is logged once.
func writeStats(ctx context.Context, path string, log *slog.Logger) {
	logged := false
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		b, _ := json.Marshal(ChildStats{PID: os.Getpid(), HeapInuse: ms.HeapInuse, Goroutines: runtime.NumGoroutine(), At: time.Now().UTC()})
		tmp := path + ".tmp"
		err := os.WriteFile(tmp, b, 0o644)
		if err == nil {
			err = os.Rename(tmp, path)
		}
		if err != nil && !logged {
			log.Error("bench: write stats", "file", path, "error", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// readStats reads the ChildStats of process pid from path; ok is false
// when the file is missing, unreadable or another process's.
func readStats(path string, pid int) (ChildStats, bool) {
	var st ChildStats
	b, err := os.ReadFile(path)
	if err != nil || json.Unmarshal(b, &st) != nil || st.PID != pid {
		return ChildStats{}, false
	}
	return st, true
}

// topologyNamed is topology() with the given exchange name: a child
// process rebuilds its parent's topology from the name alone.
func topologyNamed(ex string) broker.Topology {
	return broker.Topology{Exchange: ex, Queues: []broker.Queue{{
		Name: ex + ".send", Bindings: []string{EventType}, RetryDelays: []time.Duration{time.Second},
	}}}
}

// duplicatesTable records, from the child worker, every delivery the
// dedup dropped as already processed; a row is written at once (autocommit)
// so it survives a SIGKILL of the worker.
const duplicatesTable = `CREATE TABLE IF NOT EXISTS bench_duplicates (message_id text NOT NULL, at timestamptz NOT NULL DEFAULT now())`

// RunChild runs the relay or the worker of cfg until ctx is done; the
// worker's handler is the benchmark's DB-only handler, which counts its
// runs per business row (notifications.attempts). It returns nil after a
// graceful stop.
func RunChild(ctx context.Context, cfg ChildConfig) error {
	if cfg.Role != RoleRelay && cfg.Role != RoleWorker {
		return fmt.Errorf("%w: role %q: want %s or %s", ErrConfig, cfg.Role, RoleRelay, RoleWorker)
	}
	if cfg.DatabaseURL == "" || cfg.Exchange == "" || cfg.Open == nil {
		return fmt.Errorf("%w: DatabaseURL, Exchange and Open are required", ErrConfig)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	workers := cfg.Workers
	if workers <= 0 {
		workers = 20
	}
	if cfg.StatsFile != "" {
		sctx, stop := context.WithCancel(ctx)
		defer stop()
		go writeStats(sctx, cfg.StatsFile, cfg.Logger)
	}
	db := &database{url: cfg.DatabaseURL}
	tp := topologyNamed(cfg.Exchange)
	br, err := connect(ctx, cfg, tp)
	if err != nil {
		return err
	}
	defer br.Close()
	if cfg.Role == RoleRelay {
		pool, err := db.pool(ctx, relayConcurrency+2)
		if err != nil {
			return err
		}
		defer pool.Close()
		relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Broker: br, BatchSize: relayBatch, Concurrency: relayConcurrency, Retention: -1, Logger: cfg.Logger})
		if err != nil {
			return err
		}
		return ignoreCanceled(relay.Run(ctx))
	}
	pool, err := db.pool(ctx, workers+3)
	if err != nil {
		return err
	}
	defer pool.Close()
	w, err := worker.New(worker.Config{
		Consumer: "bench", Queue: tp.Queues[0].Name, Topology: tp, Pool: pool, Broker: br, Handler: DBHandler(nil),
		Concurrency: workers, Logger: cfg.Logger, ShutdownTimeout: 5 * time.Second,
		OnOutcome: func(m *broker.Message, o worker.Outcome, _ time.Duration) {
			if o == worker.OutcomeDuplicate {
				if _, err := pool.Exec(context.WithoutCancel(ctx), `INSERT INTO bench_duplicates (message_id) VALUES ($1)`, m.ID); err != nil {
					cfg.Logger.Error("bench: record duplicate", "error", err)
				}
			}
		},
	})
	if err != nil {
		return err
	}
	return ignoreCanceled(w.Run(ctx))
}

// connect opens the broker and declares tp, retrying every half second
// while the broker cannot be reached (a child started while its broker
// restarts waits for it, as ferry relay and ferry worker do). What waiting
// cannot cure (broker.IsPermanent: a refused Config or login, a topology
// the broker refuses) is returned at once.
func connect(ctx context.Context, cfg ChildConfig, tp broker.Topology) (broker.Broker, error) {
	for attempt := 1; ; attempt++ {
		br, err := cfg.Open(ctx)
		if err == nil {
			if err = br.Declare(ctx, tp); err == nil {
				return br, nil
			}
			_ = br.Close()
		}
		if broker.IsPermanent(err) {
			return nil, err
		}
		if attempt == 1 {
			cfg.Logger.Warn("bench: broker not reachable; retrying", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func ignoreCanceled(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// child is a running relay or worker process.
type child struct {
	cmd  *exec.Cmd
	done chan error
}

// spawn starts role as a child process, its output appended to
// out/faults-<broker>-<role>.log.
func (r *runner) spawn(ctx context.Context, t Target, role, dbURL, exchange string) (*child, error) {
	return r.spawnAs(ctx, ScenarioFaults, t, role, dbURL, exchange)
}

// spawnAs starts role as a child process of scenario, with the extra
// args, its output appended to out/<scenario>-<broker>-<role>.log.
func (r *runner) spawnAs(ctx context.Context, scenario string, t Target, role, dbURL, exchange string, extra ...string) (*child, error) {
	args := []string{"--role", role, "--database-url", dbURL, "--broker", t.Name, "--exchange", exchange, "--workers", strconv.Itoa(r.cfg.Workers)}
	cmd := r.cfg.Spawn(ctx, append(args, extra...))
	logf, err := os.OpenFile(filepath.Join(r.cfg.Out, scenario+"-"+t.Name+"-"+role+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("bench: child log: %w", err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("bench: start %s: %w", role, err)
	}
	c := &child{cmd: cmd, done: make(chan error, 1)}
	go func() {
		c.done <- cmd.Wait()
		logf.Close()
	}()
	return c, nil
}

// kill sends SIGKILL and waits for the process to be gone.
func (c *child) kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

// stop asks for a graceful stop (SIGTERM), and kills after 15 s.
func (c *child) stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(15 * time.Second):
		c.kill()
	}
}

// fault is one injected failure and when it happened.
type fault struct {
	name      string
	at, ended time.Duration // since the start
	err       error
}

// childRun prepares a run of the relay and the worker as child processes
// (faults, soak): a database of its own with the duplicates table, and a
// topology declared on t. The caller closes db and calls r.cleanup with
// the topology; on error nothing is left to close.
func (r *runner) childRun(ctx context.Context, t Target) (*database, broker.Topology, error) {
	db, err := newDatabase(ctx, r.cfg.DatabaseURL)
	if err != nil {
		return nil, broker.Topology{}, err
	}
	fail := func(err error) (*database, broker.Topology, error) {
		db.close()
		return nil, broker.Topology{}, err
	}
	if _, err := db.admin.Exec(ctx, duplicatesTable); err != nil {
		return fail(fmt.Errorf("bench: %w", err))
	}
	tp := topology()
	br, err := openBroker(ctx, t)
	if err != nil {
		return fail(err)
	}
	err = declare(ctx, br, tp)
	_ = br.Close()
	if err != nil {
		r.cleanup(t, tp)
		return fail(err)
	}
	return db, tp, nil
}

// faults: producers commit events while the relay and the worker run as
// child processes; a quarter in, the broker restarts; half-way the relay
// is killed with SIGKILL and started again; three quarters in, the
// worker. Lost events (must be 0), duplicates redelivered and absorbed by
// the dedup, effects applied twice (must be 0) and the seconds until the
// handled rate is back to half the producers' rate after each fault.
func (r *runner) faults(ctx context.Context, t Target) ([]Result, error) {
	if r.cfg.Spawn == nil {
		return []Result{{Status: statusUnsupported, Note: "needs the ferry binary to run the relay and the worker as child processes"}}, nil
	}
	// A steady rate the pipeline keeps up with, so a fault shows as a
	// lag that grows and shrinks again: --rate, else 200/s. Producers run
	// until the faults are over and --messages events, at most 20 s of
	// them, were committed.
	rt := r.cfg.Rate
	if rt == 0 {
		rt = 200
	}
	n := min(r.cfg.Messages, 20*rt)
	db, tp, err := r.childRun(ctx, t)
	if err != nil {
		return nil, err
	}
	defer db.close()
	defer r.cleanup(t, tp)
	var mu sync.Mutex
	children := map[string]*child{}
	for _, role := range []string{RoleRelay, RoleWorker} {
		c, err := r.spawn(ctx, t, role, db.url, tp.Exchange)
		if err != nil {
			return nil, err
		}
		children[role] = c
	}
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range children {
			c.stop()
		}
	}()
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
		series    []Point
		lags      []float64 // committed minus handled at each point of series
	)
	lagNow := func() int64 { return committed.Load() - sent.Load() }

	// Producers commit at rt until the faults are over and at least n
	// events were committed.
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

	// The sampler: handled events every 100 ms.
	sctx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
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
			case <-t.C:
			}
		}
	}()

	// caughtUp waits until the lag is back to a quarter second of
	// production, at most 30 s.
	slack := int64(max(rt/4, 5))
	caughtUp := func() {
		_ = waitFor(ctx, 30*time.Second, func() bool { return lagNow() <= slack }, nil)
	}
	restart := func(role string) func() error {
		return func() error {
			mu.Lock()
			defer mu.Unlock()
			children[role].kill()
			c, err := r.spawn(ctx, t, role, db.url, tp.Exchange)
			if err != nil {
				return err
			}
			children[role] = c
			return nil
		}
	}
	type step struct {
		name string
		do   func() error
	}
	steps := []step{{"relay SIGKILL", restart(RoleRelay)}, {"worker SIGKILL", restart(RoleWorker)}}
	if r.cfg.RestartBroker != nil {
		steps = append([]step{{"broker restart", func() error { return r.cfg.RestartBroker(ctx, t.Name) }}}, steps...)
	}
	b := r.newBar("faults "+t.Name, n)
	progress := func() { b.update(sent.Load()) }
	var faults []fault
	_ = waitFor(ctx, time.Minute, func() bool { return committed.Load() >= int64(n/4) }, progress)
	for _, st := range steps {
		caughtUp()
		f := fault{name: st.name, at: time.Since(start)}
		f.err = st.do()
		f.ended = time.Since(start)
		faults = append(faults, f)
		_ = waitFor(ctx, time.Second, func() bool { return false }, progress) // a second of faulty running
	}
	_ = waitFor(ctx, 10*time.Minute, func() bool { return committed.Load() >= int64(n) }, progress)
	stopProducing()
	perr := <-prodErr
	// Count the committed events in the database, again on every poll: a
	// commit cut short by the stop may still land, without its producer
	// knowing.
	var total int64
	countAll := func() int64 {
		var c int64
		if qerr := db.admin.QueryRow(ctx, `SELECT count(*) FROM notifications`).Scan(&c); qerr == nil {
			total = c
			committed.Store(c)
			b.setTotal(c)
		}
		return total
	}
	countAll()
	// The drain: done when every committed event was handled; a stall
	// when none was handled for a minute. A slow pipeline that still
	// catches up (ElasticMQ on a loaded machine, after a broker restart)
	// is given up to drainCap.
	var (
		lastSent = sent.Load()
		lastMove = time.Now()
	)
	err = waitFor(ctx, drainCap, func() bool {
		if s := sent.Load(); s != lastSent {
			lastSent, lastMove = s, time.Now()
		}
		return sent.Load() >= countAll() || time.Since(lastMove) > time.Minute
	}, progress)
	if err == nil && sent.Load() < countAll() {
		err = errors.New("bench: no event handled for a minute")
	}
	var shortfall string
	if err != nil && ctx.Err() == nil {
		shortfall = diagnoseShortfall(ctx, db, t, tp, func() int64 { return sent.Load() }, countAll)
	}
	stopSampling()
	<-sampled
	b.finish(sent.Load())
	if perr != nil {
		return nil, perr
	}
	var final int64
	if qerr := db.admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'sent'), count(*) FROM notifications`).Scan(&final, &total); qerr != nil {
		return nil, qerr
	}
	sent.Store(final)
	n = int(total)
	elapsed := time.Since(start)
	out := Result{Messages: n, Seconds: elapsed.Seconds(), Series: series}
	var dups, twice int64
	if qerr := db.admin.QueryRow(ctx, `SELECT count(*) FROM bench_duplicates`).Scan(&dups); qerr != nil {
		return nil, qerr
	}
	if qerr := db.admin.QueryRow(ctx, `SELECT count(*) FROM notifications WHERE attempts > 1`).Scan(&twice); qerr != nil {
		return nil, qerr
	}
	lost := int64(n) - sent.Load()
	out.add("lost", float64(lost), "")
	out.add("duplicates absorbed", float64(dups), "")
	out.add("effects applied twice", float64(twice), "")
	note := fmt.Sprintf("%d events at %d/s, one fault at a time after the lag is back; ", n, rt)
	if r.cfg.RestartBroker == nil {
		note += "broker restart not measured (no way to restart this broker); "
	}
	for _, f := range faults {
		if f.err != nil {
			note += fmt.Sprintf("%s at %s failed: %v; ", f.name, FormatSeconds(f.at.Seconds()), f.err)
			continue
		}
		rec := recovery(series, lags, f.at.Seconds(), float64(slack))
		name := f.name + " recovery"
		out.add(name, rec, "s")
		note += fmt.Sprintf("%s at %s (took %s", f.name, FormatSeconds(f.at.Seconds()), FormatSeconds((f.ended - f.at).Seconds()))
		switch rec {
		case 0:
			note += fmt.Sprintf("; the lag never grew past the median plus %d events, recovery 0", slack)
		case -1:
			note += "; the lag never came back, recovery -1"
		}
		note += "); "
	}
	out.Note = note[:len(note)-2]
	if err != nil {
		out.Status = statusFailed
		out.Note = fmt.Sprintf("%v: %d of %d handled (%s); %s", err, sent.Load(), n, shortfall, out.Note)
	}
	return []Result{out}, nil
}

// recovery returns the seconds from a fault at second at until the
// pipeline caught up again: the lag (committed minus handled, lags[i] at
// series[i].X) grew past slack events (a quarter second of production
// beyond the median lag of the second before the fault) and came back under it. It returns
// 0 when the lag never grew past it (the fault did not show), -1 when it
// never came back.
func recovery(series []Point, lags []float64, at, slack float64) float64 {
	// The usual lag: the median over the second before the fault.
	var before []float64
	for i, p := range series {
		if p.X >= at-1 && p.X < at {
			before = append(before, lags[i])
		}
	}
	base := 0.0
	if len(before) > 0 {
		slices.Sort(before)
		base = before[len(before)/2]
	}
	limit := base + slack
	exceeded := false
	for i, p := range series {
		if p.X < at {
			continue
		}
		switch {
		case lags[i] > limit:
			exceeded = true
		case exceeded:
			return p.X - at
		}
	}
	if exceeded {
		return -1
	}
	return 0
}

// drainCap bounds the faults scenario's drain after the producers stop,
// while events are still being handled (a drain that handles none for a
// minute ends at once).
const drainCap = 5 * time.Minute

// shortfallWait is how much longer diagnoseShortfall waits for the events
// still unhandled, to tell a stall from a loss.
const shortfallWait = 2 * time.Minute

// diagnoseShortfall says where the events not handled when the drain
// ended are, while the relay and the worker still run: rows
// the relay has not published (outbox rows without processed_at), rows it
// marked published whose notification was not handled, and the work
// queue's backlog as the broker tells it (broker.BacklogReporter: Kafka's
// lag behind the group's committed offsets, RabbitMQ's ready and
// unacknowledged messages, ...). It then waits up to shortfallWait more
// and says how many of them were handled meanwhile: all of them is a
// stall, not a loss; none, with nothing left unpublished and nothing in
// the broker's backlog, is a loss between the broker's acknowledgement
// and the worker.
func diagnoseShortfall(ctx context.Context, db *database, t Target, tp broker.Topology, sent, total func() int64) string {
	missing := total() - sent()
	var unpublished, publishedUnhandled int64
	qerr := db.admin.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE o.processed_at IS NULL),
		       count(*) FILTER (WHERE o.processed_at IS NOT NULL AND n.status IS DISTINCT FROM 'sent')
		FROM outbox o
		LEFT JOIN notifications n ON n.id = (convert_from(o.payload, 'UTF8')::json->>'notification_id')::bigint
		WHERE o.processed_at IS NULL OR n.status IS DISTINCT FROM 'sent'`).Scan(&unpublished, &publishedUnhandled)
	msg := fmt.Sprintf("%d not handled: ", missing)
	if qerr != nil {
		msg += fmt.Sprintf("outbox not read: %v", qerr)
	} else {
		msg += fmt.Sprintf("%d not published by the relay, %d published and not handled", unpublished, publishedUnhandled)
	}
	if br, err := t.Open(ctx); err == nil {
		if bl, ok := br.(broker.BacklogReporter); ok {
			if err := br.Declare(ctx, tp); err == nil {
				if b, err := bl.Backlog(ctx, tp.Queues[0].Name); err == nil {
					msg += fmt.Sprintf(", broker backlog %d messages (oldest %s)", b.Messages, FormatSeconds(b.OldestAge.Seconds()))
				} else {
					msg += fmt.Sprintf(", broker backlog not read: %v", err)
				}
			}
		}
		_ = br.Close()
	}
	began, before := time.Now(), sent()
	_ = waitFor(ctx, shortfallWait, func() bool { return sent() >= total() }, nil)
	late := sent() - before
	switch {
	case late >= missing:
		return msg + fmt.Sprintf("; all %d handled %s later: a stall, not a loss", missing, FormatSeconds(time.Since(began).Seconds()))
	default:
		return msg + fmt.Sprintf("; %d of them handled in the %s after", late, FormatSeconds(shortfallWait.Seconds()))
	}
}
