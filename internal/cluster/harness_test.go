package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// rate is the load of every failover test: events per second through the
// whole pipeline.
const rate = 200

// phase is how long the load runs before a fault and after it (the
// drain comes after), and how long a killed node stays down:
// FERRY_CLUSTER_PHASE, default 2s (make test); make test-cluster runs 15s.
func phase(t *testing.T) time.Duration {
	if v := os.Getenv("FERRY_CLUSTER_PHASE"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, "FERRY_CLUSTER_PHASE")
		return d
	}
	return 2 * time.Second
}

// script is the checkout's compose/local/services.sh.
var script = Script{Path: filepath.Join(testenv.RepoRoot(), "compose", "local", "services.sh")}

// services runs compose/local/services.sh with args and returns its
// standard output; it fails the test when the script fails.
func services(t *testing.T, args ...string) string {
	t.Helper()
	out, err := script.Run(context.Background(), args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// up starts role's cluster (stopped again when the test ends, so that one
// cluster runs at a time) and returns the variables `services.sh env`
// prints for it.
func up(t *testing.T, role string) map[string]string {
	t.Helper()
	start := time.Now()
	services(t, "up", role)
	t.Logf("%s: cluster up in %v", role, time.Since(start).Round(time.Second))
	t.Cleanup(func() { services(t, "down", role) })
	env, err := script.Env(context.Background(), role)
	require.NoError(t, err)
	return env
}

// node runs `services.sh node role n what` (kill, pause, resume, stop,
// start).
func node(t *testing.T, role string, n int, what string) {
	t.Helper()
	require.NoError(t, script.Node(context.Background(), role, n, what))
}

// system is one clustered broker under test.
type system struct {
	role string // the services.sh role
	// open connects a new adapter to the cluster.
	open func(ctx context.Context, log *slog.Logger) (broker.Broker, error)
	// detect is longer than the cluster's failure detection: how long
	// pause-leader keeps the leader stopped.
	detect time.Duration
	// leader returns the node (1..3) that leads the work queue, the
	// partition or the stream of the rig's topology.
	leader func(t *testing.T, rg *rig) int
	// consumerLeader, when set, returns the node that leads the work
	// queue's consumer where that is a replicated object of its own
	// (JetStream); it fails the test when none does.
	consumerLeader func(t *testing.T, rg *rig) int
}

// rig is one pipeline: a database, a relay and a worker, and the counts a
// failover test checks.
type rig struct {
	t     *testing.T
	pool  *pgxpool.Pool
	topo  broker.Topology
	queue string
	logs  *testenv.LockedBuffer

	mu        sync.Mutex
	committed []int64 // sequence numbers whose Enqueue committed
	uncertain int     // commits whose outcome is unknown (the database failed during COMMIT)
	seq       atomic.Int64

	duplicates  atomic.Int64 // deliveries the dedup absorbed
	redelivered atomic.Int64 // deliveries with Attempt > 1
	handled     atomic.Int64
	dead        atomic.Int64 // deliveries dead-lettered

	wal         bool        // the relay runs in WAL mode: it deletes the rows it published
	publishedAt []time.Time // (under mu) when each relay batch that published rows was confirmed
}

const effectsSQL = `CREATE TABLE IF NOT EXISTS effects (
	id  bigserial PRIMARY KEY,
	seq bigint NOT NULL,
	key text NOT NULL,
	at  timestamptz NOT NULL DEFAULT clock_timestamp())`

// newRig migrates pool's database and starts a relay and a worker, each on
// its own adapter from open, with a topology of its own, until the test
// ends. ordered asks the worker for per-key order; relayOpts change the
// relay's configuration (its Mode: in WAL mode the slot is created before
// the relay starts).
func newRig(t *testing.T, pool *pgxpool.Pool, open func(ctx context.Context, log *slog.Logger) (broker.Broker, error), ordered bool, relayOpts ...func(*outbox.RelayConfig)) *rig {
	t.Helper()
	return newRigSplit(t, pool, func(ctx context.Context, log *slog.Logger, _ broker.Topology) (broker.Broker, error) {
		return open(ctx, log)
	}, open, ordered, relayOpts...)
}

// newRigSplit is newRig with the relay's adapter from openRelay, which
// gets the rig's topology (to connect to the node that leads it, say),
// and the worker's from openWorker.
func newRigSplit(t *testing.T, pool *pgxpool.Pool, openRelay func(ctx context.Context, log *slog.Logger, tp broker.Topology) (broker.Broker, error),
	openWorker func(ctx context.Context, log *slog.Logger) (broker.Broker, error), ordered bool, relayOpts ...func(*outbox.RelayConfig)) *rig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, outbox.Migrate(ctx, pool))
	_, err := pool.Exec(ctx, effectsSQL)
	require.NoError(t, err)
	ex := strings.ReplaceAll(testenv.UniqueName("failover"), ".", "-")
	rg := &rig{t: t, pool: pool, queue: ex + "-work", logs: &testenv.LockedBuffer{},
		topo: broker.Topology{Exchange: ex, Queues: []broker.Queue{{Name: ex + "-work", Bindings: []string{"ev.#"}}}}}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("FERRY_CLUSTER_LOGS") != "" {
			t.Logf("logs:\n%s", rg.logs.String())
		}
	})
	log := slog.New(slog.NewTextHandler(rg.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))

	relayB, err := openRelay(ctx, log, rg.topo)
	require.NoError(t, err, "open the relay's adapter")
	t.Cleanup(func() { relayB.Close() })
	require.NoError(t, relayB.Declare(ctx, rg.topo))
	rcfg := outbox.RelayConfig{Pool: pool, Broker: relayB, Retention: -1, Logger: log,
		OnBatch: func(s outbox.BatchStats) {
			if s.Published > 0 {
				rg.mu.Lock()
				rg.publishedAt = append(rg.publishedAt, time.Now())
				rg.mu.Unlock()
			}
		}}
	for _, o := range relayOpts {
		o(&rcfg)
	}
	relay, err := outbox.NewRelay(rcfg)
	require.NoError(t, err)
	if rcfg.Mode == outbox.RelayModeWAL {
		rg.wal = true
		require.NoError(t, relay.EnsureSlot(ctx))
	}

	workB, err := openWorker(ctx, log)
	require.NoError(t, err, "open the worker's adapter")
	t.Cleanup(func() { workB.Close() })
	require.NoError(t, workB.Declare(ctx, rg.topo))
	w, err := worker.New(worker.Config{
		Consumer: "failover", Queue: rg.queue, Pool: pool, Broker: workB, Topology: rg.topo,
		Concurrency: 8, Ordered: ordered, Logger: log,
		Handler: func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
			var ev struct{ Seq int64 }
			if err := json.Unmarshal(msg.Body, &ev); err != nil {
				return worker.Permanent(err)
			}
			if msg.Attempt > 1 {
				rg.redelivered.Add(1)
			}
			_, err := tx.Exec(ctx, `INSERT INTO effects (seq, key) VALUES ($1, $2)`, ev.Seq, msg.Key)
			return err
		},
		OnOutcome: func(_ *broker.Message, o worker.Outcome, _ time.Duration) {
			switch o {
			case worker.OutcomeDuplicate:
				rg.duplicates.Add(1)
			case worker.OutcomeAck:
				rg.handled.Add(1)
			case worker.OutcomeDead:
				rg.dead.Add(1)
			}
		},
	})
	require.NoError(t, err)

	runCtx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = relay.Run(runCtx) }()
	go func() { defer wg.Done(); _ = w.Run(runCtx) }()
	t.Cleanup(func() { stop(); wg.Wait() })
	return rg
}

// load enqueues rate events a second (a transaction of 10 every
// 10s/rate: 50ms), keys k0..k15, until ctx is done; a failed transaction
// is counted as uncertain when its COMMIT failed, and the load goes on.
func (rg *rig) load(ctx context.Context) {
	tick := time.NewTicker(10 * time.Second / rate)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		rg.enqueue10(ctx)
	}
}

func (rg *rig) enqueue10(ctx context.Context) {
	tctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tx, err := rg.pool.Begin(tctx)
	if err != nil {
		return
	}
	defer tx.Rollback(context.Background())
	seqs := make([]int64, 10)
	evs := make([]outbox.Event, 10)
	for i := range evs {
		s := rg.seq.Add(1)
		seqs[i] = s
		evs[i] = outbox.Event{Type: "ev.x", Key: fmt.Sprintf("k%d", s%16), Body: []byte(fmt.Sprintf(`{"Seq":%d}`, s))}
	}
	if _, err := outbox.Enqueue(tctx, tx, evs...); err != nil {
		return
	}
	if err := tx.Commit(tctx); err != nil {
		rg.mu.Lock()
		rg.uncertain += len(seqs)
		rg.mu.Unlock()
		return
	}
	rg.mu.Lock()
	rg.committed = append(rg.committed, seqs...)
	rg.mu.Unlock()
}

// result is what one failover run measured.
type result struct {
	Committed, Lost, Duplicates, Charged, WorkerAttempts int
	Reordered                                            int
	Absorbed, Redelivered                                int64
	Recovery                                             time.Duration // fault to the first event enqueued after it handled
	PublishRecovery                                      time.Duration // fault to the first event enqueued after it published (confirmed by the broker)
	Stall                                                time.Duration // the longest time without a handled event, from the fault on
}

// run drives the load for a phase, calls fault (which returns when the
// fault is over: the node restarted, resumed or promoted, and which calls
// mark at the moment it strikes), drives it another phase, then waits
// until every outbox row is handled and checks the counts.
func (rg *rig) run(fault func(mark func())) result {
	t := rg.t
	ctx, stop := context.WithCancel(context.Background())
	loaded := make(chan struct{})
	go func() { defer close(loaded); rg.load(ctx) }()
	time.Sleep(phase(t))
	var faultAt time.Time
	var seqAtFault int64
	fault(func() { faultAt, seqAtFault = time.Now(), rg.seq.Load() })
	require.False(t, faultAt.IsZero(), "the fault did not call mark")
	time.Sleep(phase(t))
	stop()
	<-loaded

	// Drain: bounded so that a lost event fails the test instead of
	// hanging it.
	// It waits for the relay too: a batch whose confirms the failover
	// took is in the broker (and handled) but still unmarked until the
	// relay publishes it again after its backoff.
	var rows, done, unmarked int
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		qctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := rg.pool.QueryRow(qctx, `SELECT (SELECT count(*) FROM outbox),
			(SELECT count(DISTINCT o.id) FROM outbox o JOIN effects e ON e.seq = (convert_from(o.payload, 'UTF8')::json->>'Seq')::bigint),
			(SELECT count(*) FROM outbox WHERE processed_at IS NULL)`).Scan(&rows, &done, &unmarked)
		cancel()
		if err == nil && rows == done && unmarked == 0 {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	time.Sleep(time.Second) // late redeliveries, to count their duplicates
	bg := context.Background()
	var res result
	rg.mu.Lock()
	committed := append([]int64(nil), rg.committed...)
	uncertain := rg.uncertain
	rg.mu.Unlock()
	res.Committed = len(committed)
	require.NoError(t, rg.pool.QueryRow(bg, `SELECT count(*) FROM unnest($1::bigint[]) c(seq) WHERE NOT EXISTS (SELECT FROM effects e WHERE e.seq = c.seq)`, committed).Scan(&res.Lost))
	var outboxLost int
	require.NoError(t, rg.pool.QueryRow(bg, `SELECT count(*) FROM outbox o WHERE NOT EXISTS (SELECT FROM effects e WHERE e.seq = (convert_from(o.payload, 'UTF8')::json->>'Seq')::bigint)`).Scan(&outboxLost))
	require.NoError(t, rg.pool.QueryRow(bg, `SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) n FROM effects GROUP BY seq HAVING count(*) > 1) d`).Scan(&res.Duplicates))
	require.NoError(t, rg.pool.QueryRow(bg, `SELECT count(*) FROM outbox WHERE attempts > 0 OR processed_at IS NULL`).Scan(&res.Charged))
	require.NoError(t, rg.pool.QueryRow(bg, `SELECT count(*) FROM worker_attempts`).Scan(&res.WorkerAttempts))
	// Per key, effects in handling order must follow the sequence order.
	require.NoError(t, rg.pool.QueryRow(bg, `SELECT count(*) FROM (SELECT seq < lag(seq) OVER (PARTITION BY key ORDER BY id) AS back FROM effects) x WHERE back`).Scan(&res.Reordered))
	var first *time.Time
	require.NoError(t, rg.pool.QueryRow(bg, `SELECT min(at) FROM effects WHERE seq > $1`, seqAtFault).Scan(&first))
	if first != nil {
		res.Recovery = first.Sub(faultAt)
	}
	var published *time.Time
	if rg.wal {
		// The WAL relay deletes what it published: the first batch the
		// broker confirmed after the fault (events from before it, handed
		// over or streamed, count too: the relay publishes again).
		rg.mu.Lock()
		for _, at := range rg.publishedAt {
			if at.After(faultAt) {
				published = &at
				break
			}
		}
		rg.mu.Unlock()
	} else {
		require.NoError(t, rg.pool.QueryRow(bg, `SELECT min(processed_at) FROM outbox WHERE (convert_from(payload, 'UTF8')::json->>'Seq')::bigint > $1`, seqAtFault).Scan(&published))
	}
	if published != nil {
		res.PublishRecovery = published.Sub(faultAt)
	}
	// The first gap runs from the fault to the first event handled after it.
	var stall *time.Duration
	require.NoError(t, rg.pool.QueryRow(bg, `SELECT max(gap) FROM (SELECT at - lag(at, 1, $1) OVER (ORDER BY at) AS gap FROM effects WHERE at >= $1) g`, faultAt).Scan(&stall))
	if stall != nil {
		res.Stall = *stall
	}
	res.Absorbed, res.Redelivered = rg.duplicates.Load(), rg.redelivered.Load()
	t.Logf("RESULT %s: committed=%d uncertain=%d lost=%d (outbox rows without effect %d) duplicate_effects=%d charged_or_unprocessed=%d worker_attempts=%d redeliveries_absorbed=%d redelivered=%d reordered=%d published_after=%v recovery=%v stall=%v",
		t.Name(), res.Committed, uncertain, res.Lost, outboxLost, res.Duplicates, res.Charged, res.WorkerAttempts, res.Absorbed, res.Redelivered, res.Reordered, res.PublishRecovery.Round(time.Millisecond), res.Recovery.Round(time.Millisecond), res.Stall.Round(time.Millisecond))
	require.Positive(t, res.Committed, "no event committed")
	require.Zero(t, rg.dead.Load(), "messages dead-lettered (a body the handler could not read arrived)")
	require.Zero(t, res.Lost, "committed events without an effect")
	require.Zero(t, outboxLost, "outbox rows without an effect")
	require.Zero(t, res.Duplicates, "duplicate effects")
	if res.Charged > 0 {
		rs, err := rg.pool.Query(bg, `SELECT attempts, processed_at IS NULL, COALESCE(last_error, ''), count(*) FROM outbox
			WHERE attempts > 0 OR processed_at IS NULL GROUP BY 1, 2, 3 ORDER BY 4 DESC LIMIT 10`)
		require.NoError(t, err)
		for rs.Next() {
			var attempts, n int
			var unprocessed bool
			var reason string
			require.NoError(t, rs.Scan(&attempts, &unprocessed, &reason, &n))
			t.Logf("charged or unprocessed: %d rows, attempts=%d unprocessed=%v last_error=%q", n, attempts, unprocessed, reason)
		}
		require.NoError(t, rs.Err())
	}
	require.Zero(t, res.Charged, "outbox rows charged an attempt or left unprocessed by the failover")
	require.Zero(t, res.WorkerAttempts, "worker attempts recorded because of the failover")
	require.NotNil(t, first, "no event enqueued after the fault was handled")
	return res
}

// ---------------------------------------------------------------- leaders

// consumerLeaderOf returns the function that finds the node leading a
// rig's work queue's consumer on nodes (Nodes.ConsumerLeader), within
// 10 s: a healthy cluster under load names it.
func consumerLeaderOf(nodes Nodes) func(t *testing.T, rg *rig) int {
	return func(t *testing.T, rg *rig) int {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n, err := nodes.ConsumerLeader(ctx, rg.topo)
		require.NoError(t, err, "the work queue's consumer has no leader on a healthy cluster")
		require.True(t, n >= 1 && n <= len(nodes.URLs), "consumer leader node %d of %d", n, len(nodes.URLs))
		return n
	}
}

// leaderOf returns the function that finds the node leading a rig's work
// queue, the partition or the stream on nodes (Nodes.Leader), within 30 s.
func leaderOf(nodes Nodes) func(t *testing.T, rg *rig) int {
	return func(t *testing.T, rg *rig) int {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		n, err := nodes.Leader(ctx, rg.topo)
		require.NoError(t, err)
		return n
	}
}

// ---------------------------------------------------------------- faults

// faults are the fault kinds every clustered broker is tested with.
var faults = []struct {
	name string
	run  func(t *testing.T, sys system, rg *rig, mark func())
}{
	{"kill-leader", func(t *testing.T, sys system, rg *rig, mark func()) {
		n := sys.leader(t, rg)
		t.Logf("kill -9 node %d (the leader)", n)
		node(t, sys.role, n, "kill")
		mark() // the node is gone: what is enqueued from now on needs the failover
		time.Sleep(phase(t))
		node(t, sys.role, n, "start")
	}},
	{"kill-follower", func(t *testing.T, sys system, rg *rig, mark func()) {
		// Node 1, where RabbitMQ's connections open (the first URL), unless
		// it leads: then node 2.
		n := 1
		if sys.leader(t, rg) == 1 {
			n = 2
		}
		if sys.consumerLeader != nil {
			// JetStream places a consumer's leader apart from its stream's:
			// killing it costs one consumer election (4-9 s in nats-server).
			c := sys.consumerLeader(t, rg)
			t.Logf("kill -9 node %d (not the stream's leader; the queue's consumer is led by node %d)", n, c)
		} else {
			t.Logf("kill -9 node %d (not the leader)", n)
		}
		node(t, sys.role, n, "kill")
		mark() // the node is gone: what is enqueued from now on needs the failover
		time.Sleep(phase(t))
		node(t, sys.role, n, "start")
	}},
	{"pause-leader", func(t *testing.T, sys system, rg *rig, mark func()) {
		n := sys.leader(t, rg)
		t.Logf("SIGSTOP node %d (the leader) for %v, beyond failure detection, then SIGCONT", n, sys.detect)
		node(t, sys.role, n, "pause")
		mark() // the node is gone: what is enqueued from now on needs the failover
		time.Sleep(sys.detect)
		node(t, sys.role, n, "resume")
	}},
	{"rolling-restart", func(t *testing.T, sys system, rg *rig, mark func()) {
		mark()
		for n := 1; n <= 3; n++ {
			t.Logf("restart node %d", n)
			node(t, sys.role, n, "stop")
			node(t, sys.role, n, "start")
		}
	}},
}

// failover runs, on sys, the per-key order check without a fault and
// then every fault, each on a rig of its own. Under a fault a message
// redelivered after a lost connection may come after later messages of its
// key (worker.Config.Ordered holds "up to retries"); those are counted and
// printed, and must be 0 without a fault.
func failover(t *testing.T, sys system) {
	t.Run("ordered", func(t *testing.T) {
		pool, _ := testenv.NewPool(t)
		rg := newRig(t, pool, sys.open, true)
		res := rg.run(func(mark func()) { mark() })
		require.Zero(t, res.Reordered, "effects of one key out of order on a healthy cluster with Ordered")
	})
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			// Each fault starts on a whole cluster: `up` on running nodes
			// starts none and waits until the cluster is ready (for NATS,
			// every server back in JetStream's meta group), so that a node
			// the last fault restarted is not still rejoining.
			services(t, "up", sys.role)
			pool, _ := testenv.NewPool(t)
			rg := newRig(t, pool, sys.open, true)
			rg.run(func(mark func()) { f.run(t, sys, rg, mark) })
		})
	}
}
