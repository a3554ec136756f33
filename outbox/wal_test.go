package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/alert"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/rabbitmq"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// walSlot is a slot name unique to the test (slots are server-wide).
func walSlot(t testing.TB) string {
	return fmt.Sprintf("ferry_t_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)
}

// receiveOrdered receives want messages (duplicates counted) from queue
// and returns their IDs in arrival order, then lingers for duplicates.
func receiveOrdered(t testing.TB, b broker.Broker, queue string, distinct int, linger time.Duration) []string {
	t.Helper()
	msgs := receiveMessages(t, b, queue, distinct, linger)
	order := make([]string, len(msgs))
	for i, m := range msgs {
		order[i] = m.ID
	}
	return order
}

// receiveMessages is receiveOrdered returning the messages.
func receiveMessages(t testing.TB, b broker.Broker, queue string, distinct int, linger time.Duration) []*broker.Message {
	t.Helper()
	ctx := testCtx(t)
	sub, err := b.Subscribe(ctx, queue, broker.SubscribeOptions{Prefetch: 500})
	require.NoError(t, err)
	defer sub.Close()
	var order []*broker.Message
	seen := map[string]bool{}
	deadline := time.Now().Add(90 * time.Second)
	for len(seen) < distinct || linger > 0 {
		d := deadline
		if len(seen) >= distinct {
			d = time.Now().Add(linger)
		}
		rctx, cancel := context.WithDeadline(ctx, d)
		m, err := sub.Receive(rctx)
		cancel()
		if err != nil && len(seen) >= distinct {
			require.ErrorIs(t, err, context.DeadlineExceeded)
			break
		}
		require.NoError(t, err, "received %d of %d distinct messages", len(seen), distinct)
		order = append(order, m.Message())
		seen[m.Message().ID] = true
		require.NoError(t, m.Ack(ctx))
	}
	return order
}

// requireKeyOrder checks that the first arrivals of got hold, for each
// partition key, the IDs of want (in commit order) of that key in the same
// order, and nothing else.
func requireKeyOrder(t testing.TB, want []int64, keyOf map[int64]string, got []*broker.Message) {
	t.Helper()
	wantBy, gotBy := map[string][]string{}, map[string][]string{}
	for _, id := range want {
		wantBy[keyOf[id]] = append(wantBy[keyOf[id]], strconv.FormatInt(id, 10))
	}
	seen := map[string]bool{}
	for _, m := range got {
		if !seen[m.ID] {
			seen[m.ID] = true
			gotBy[m.Key] = append(gotBy[m.Key], m.ID)
		}
	}
	// The events without a key have no order.
	slices.Sort(wantBy[""])
	slices.Sort(gotBy[""])
	require.Equal(t, wantBy, gotBy, "per key: the first arrivals in commit order")
}

// keysOf maps the ids Enqueue returned for evs to the events' keys.
func keysOf(keyOf map[int64]string, ids []int64, evs []outbox.Event) {
	for i, id := range ids {
		keyOf[id] = evs[i].Key
	}
}

// waitStreaming waits until a relay streams from slot, so that the
// events enqueued next are the stream's (those committed before the slot
// exists are handed to the polling side).
func waitStreaming(t testing.TB, pool *pgxpool.Pool, slot string) {
	t.Helper()
	require.Eventually(t, func() bool {
		s, err := outbox.ReadWALStats(testCtx(t), pool, slot, "")
		require.NoError(t, err)
		return s.Active
	}, 60*time.Second, 20*time.Millisecond, "a relay streams slot %s", slot)
}

func walRows(t testing.TB, pool *pgxpool.Pool) int {
	var n int
	require.NoError(t, pool.QueryRow(testCtx(t), `SELECT count(*) FROM outbox WHERE next_attempt_at IS NULL AND processed_at IS NULL`).Scan(&n))
	return n
}

// The stream publishes in commit order (not id order): every event with
// one lane (Concurrency 1), each key's events with several (the default 4,
// batches of 7 split across them), deletes the confirmed rows instead of
// marking them, and the slot's confirmed position moves on.
func TestWALRelayCommitOrder(t *testing.T) {
	t.Parallel()
	for _, lanes := range []int{1, 0} {
		t.Run(fmt.Sprint("lanes=", lanes), func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			rg := setup(t)
			slot := walSlot(t)
			r := newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, Mode: outbox.RelayModeWAL, Slot: slot, BatchSize: 7, Concurrency: lanes})
			stop := runRelay(t, r)
			waitStreaming(t, rg.pool, slot)

			// Transaction a takes the lower ids and commits last.
			keyOf := map[int64]string{}
			a, err := rg.pool.Begin(ctx)
			require.NoError(t, err)
			aEvs := events(5, "test.a")
			aIDs, err := outbox.Enqueue(ctx, a, aEvs...)
			require.NoError(t, err)
			keysOf(keyOf, aIDs, aEvs)
			var want []int64
			for range 4 {
				evs := events(6, "test.b")
				ids := enqueue(t, rg.pool, evs...)
				keysOf(keyOf, ids, evs)
				want = append(want, ids...)
			}
			require.NoError(t, a.Commit(ctx))
			want = append(want, aIDs...)
			require.Less(t, aIDs[0], want[0])

			got := receiveMessages(t, rg.b, rg.queue, len(want), 300*time.Millisecond)
			requireKeyOrder(t, want, keyOf, got)
			if lanes == 1 {
				order := make([]string, len(got))
				for i, m := range got {
					order[i] = m.ID
				}
				require.Equal(t, idStrings(want), order, "one lane: every event in commit order")
			}
			require.Eventually(t, func() bool { return walRows(t, rg.pool) == 0 }, 30*time.Second, 50*time.Millisecond)
			var processed int
			require.NoError(t, rg.pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&processed))
			require.Zero(t, processed, "the WAL relay writes no row version: the confirmed rows are deleted")
			stop()
			s, err := outbox.ReadWALStats(ctx, rg.pool, slot, "")
			require.NoError(t, err)
			require.True(t, s.Exists)
			require.NotEmpty(t, s.ConfirmedLSN)
			require.Zero(t, s.Unconfirmed)
		})
	}
}

// The WAL relay gathers the confirmed batches over SettleInterval and
// settles them in one transaction: events committed one by one are all
// published at once, their rows stay until the interval ends (or the
// relay stops, which settles what it gathered before it returns), and
// then go, with the slot's position past them.
func TestWALRelayGathersSettlements(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rg := setup(t)
	slot := walSlot(t)
	cfg := outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, Mode: outbox.RelayModeWAL, Slot: slot, SettleInterval: 5 * time.Second}
	stop := runRelay(t, newRelay(t, cfg))
	waitStreaming(t, rg.pool, slot)
	var ids []int64
	for range 10 { // ten transactions, so ten small batches
		ids = append(ids, enqueue(t, rg.pool, events(1, "test.gather")...)...)
		time.Sleep(10 * time.Millisecond)
	}
	receiveOrdered(t, rg.b, rg.queue, len(ids), 0)
	require.Equal(t, len(ids), walRows(t, rg.pool), "published, and gathered: the rows wait for the interval's one settlement")
	stop()
	require.Zero(t, walRows(t, rg.pool), "a relay that stops settles what it gathered")
	s, err := outbox.ReadWALStats(ctx, rg.pool, slot, "")
	require.NoError(t, err)
	require.Zero(t, s.Unconfirmed)

	// Running, the interval settles them.
	cfg.SettleInterval = 500 * time.Millisecond
	runRelay(t, newRelay(t, cfg))
	waitStreaming(t, rg.pool, slot)
	more := enqueue(t, rg.pool, events(3, "test.gather")...)
	receiveOrdered(t, rg.b, rg.queue, len(more), 0)
	require.Eventually(t, func() bool { return walRows(t, rg.pool) == 0 }, 30*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool {
		s, err := outbox.ReadWALStats(ctx, rg.pool, slot, "")
		require.NoError(t, err)
		return s.Unconfirmed == 0
	}, 30*time.Second, 20*time.Millisecond)
}

// Scheduled events stay with the polling side of the relay; a message
// fault parks the event in the table with its reason while the stream
// goes on.
func TestWALRelayParksAndSchedules(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rg := setup(t)
	slot := walSlot(t)
	r := newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, Mode: outbox.RelayModeWAL, Slot: slot,
		PollInterval: 100 * time.Millisecond, RetryBackoff: time.Hour, MaxRetryBackoff: time.Hour})
	runRelay(t, r)
	waitStreaming(t, rg.pool, slot)
	keyOf := map[int64]string{}
	good := events(3, "test.good")
	first := enqueue(t, rg.pool, good...)
	keysOf(keyOf, first, good)
	bad := enqueue(t, rg.pool, outbox.Event{Type: "unbound.event", Key: good[0].Key, Body: []byte("poison")})[0]
	due := enqueue(t, rg.pool, outbox.Event{Type: "test.due", Body: []byte("later"), DueAt: time.Now().Add(time.Second)})[0]
	after := enqueue(t, rg.pool, good...)
	keysOf(keyOf, after, good)
	got := receiveMessages(t, rg.b, rg.queue, 7, 300*time.Millisecond)
	require.Len(t, got, 7)
	require.Equal(t, strconv.FormatInt(due, 10), got[6].ID, "the scheduled event comes when due")
	// The stream went on past the parked event: after[0], of its key,
	// came.
	requireKeyOrder(t, append(first, after...), keyOf, got[:6])

	var attempts int
	var lastErr string
	require.NoError(t, rg.pool.QueryRow(ctx, `SELECT attempts, last_error FROM outbox WHERE id = $1`, bad).Scan(&attempts, &lastErr))
	require.Equal(t, 1, attempts)
	require.Contains(t, lastErr, "unroutable")
	st, err := outbox.ReadStats(ctx, rg.pool)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Parked)
	require.EqualValues(t, 1, st.Unprocessed)
}

// A relay that dies between the broker's confirm and its settlement
// resumes from the slot's confirmed position: the same messages again,
// same IDs, nothing lost.
func TestWALRelayCrashResumes(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rg := setup(t)
	slot := walSlot(t)
	var crashes atomic.Int32
	r := newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, Mode: outbox.RelayModeWAL, Slot: slot, BatchSize: 10,
		AfterPublish: func(ctx context.Context, ids []int64) error {
			if crashes.Add(1) <= 2 {
				return errors.New("simulated crash after publish")
			}
			return nil
		}})
	runRelay(t, r)
	waitStreaming(t, rg.pool, slot)
	ids := enqueue(t, rg.pool, events(25, "test.crash")...)
	got := receiveOrdered(t, rg.b, rg.queue, len(ids), 500*time.Millisecond)
	counts := map[string]int{}
	for _, id := range got {
		counts[id]++
	}
	for _, id := range idStrings(ids) {
		require.GreaterOrEqual(t, counts[id], 1, "id %s lost", id)
	}
	require.Greater(t, len(got), len(ids), "the unsettled batch was published again")
	require.Eventually(t, func() bool { return walRows(t, rg.pool) == 0 }, 30*time.Second, 50*time.Millisecond)
	_ = ctx
}

// A slot dropped under the relay is a clear error naming what to do, and
// ResetWALSlot hands the unconfirmed events to the polling relay: none is
// lost.
func TestWALRelayDroppedSlot(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rg := setup(t)
	slot := walSlot(t)
	r := newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, Mode: outbox.RelayModeWAL, Slot: slot, PollInterval: 100 * time.Millisecond})
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	waitStreaming(t, rg.pool, slot)
	first := enqueue(t, rg.pool, events(5, "test.drop")...)
	receiveOrdered(t, rg.b, rg.queue, len(first), 0)

	// Under load: events keep coming while the slot goes.
	var lost []int64
	_, err := rg.pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1`, slot)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		lost = append(lost, enqueue(t, rg.pool, events(1, "test.drop")...)...)
		_, err := rg.pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot)
		return err == nil
	}, 30*time.Second, 20*time.Millisecond)
	lost = append(lost, enqueue(t, rg.pool, events(3, "test.drop")...)...)
	select {
	case err := <-done:
		require.ErrorIs(t, err, outbox.ErrSlotLost)
		require.ErrorContains(t, err, "ferry outbox wal-reset --wal-slot="+slot+" --yes")
		require.ErrorContains(t, err, "dropped")
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not stop on the dropped slot")
	}

	n, err := outbox.ResetWALSlot(ctx, rg.pool, slot, "")
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, int64(3))
	r2 := newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, Mode: outbox.RelayModeWAL, Slot: slot, PollInterval: 100 * time.Millisecond})
	runRelay(t, r2)
	more := enqueue(t, rg.pool, events(2, "test.drop")...)
	got := receiveOrdered(t, rg.b, rg.queue, 0, 2*time.Second)
	seen := map[string]bool{}
	for _, id := range got {
		seen[id] = true
	}
	for _, id := range idStrings(append(lost, more...)) {
		require.True(t, seen[id], "id %s lost across the dropped slot", id)
	}
}

// TestWALHelperProcess is not a test: TestWALRelayStandbyTakesOver runs
// the test binary with FERRY_WAL_HELPER set, and this runs a WAL relay in
// that process until it is killed.
func TestWALHelperProcess(t *testing.T) {
	if os.Getenv("FERRY_WAL_HELPER") == "" {
		t.Skip("helper process of TestWALRelayStandbyTakesOver")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("FERRY_WAL_HELPER_DB"))
	require.NoError(t, err)
	defer pool.Close()
	b, err := rabbitmq.New(ctx, rabbitmq.Config{URL: testenv.RabbitMQURL()})
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.Declare(ctx, broker.Topology{Exchange: os.Getenv("FERRY_WAL_HELPER_EXCHANGE"),
		Queues: []broker.Queue{{Name: os.Getenv("FERRY_WAL_HELPER_EXCHANGE") + ".work", Bindings: []string{"test.#"}}}}))
	r, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Broker: b, Mode: outbox.RelayModeWAL, Slot: os.Getenv("FERRY_WAL_HELPER_SLOT"), BatchSize: 20})
	require.NoError(t, err)
	require.NoError(t, r.Run(ctx))
}

// One relay streams a slot at a time; a standby takes over when the
// active one is killed with SIGKILL under load, and every event arrives
// (at least once, same IDs).
func TestWALRelayStandbyTakesOver(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool, dsn := testenv.NewPool(t)
	require.NoError(t, outbox.Migrate(ctx, pool))
	ex := testenv.UniqueName("outbox-wal")
	t.Cleanup(func() { deleteRabbitObjects(t, ex) })
	b := newBroker(t)
	require.NoError(t, b.Declare(ctx, broker.Topology{Exchange: ex, Queues: []broker.Queue{{Name: ex + ".work", Bindings: []string{"test.#"}}}}))
	slot := walSlot(t)
	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestWALHelperProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), "FERRY_WAL_HELPER=1", "FERRY_WAL_HELPER_DB="+dsn, "FERRY_WAL_HELPER_EXCHANGE="+ex, "FERRY_WAL_HELPER_SLOT="+slot)
		cmd.Stdout, cmd.Stderr = testWriter{t}, testWriter{t}
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	activePID := func() int {
		var pid *int
		_ = pool.QueryRow(ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&pid)
		if pid == nil {
			return 0
		}
		return *pid
	}
	a := start()
	require.Eventually(t, func() bool { return activePID() != 0 }, 60*time.Second, 50*time.Millisecond)
	first := activePID()
	bProc := start()
	_ = bProc

	// Load: a writer enqueues while the active relay is killed.
	var all []int64
	writerDone := make(chan struct{})
	stopWriting := make(chan struct{})
	go func() {
		defer close(writerDone)
		for {
			select {
			case <-stopWriting:
				return
			default:
			}
			var ids []int64
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				var err error
				ids, err = outbox.Enqueue(ctx, tx, events(5, "test.takeover")...)
				return err
			})
			if err != nil {
				return
			}
			all = append(all, ids...)
			time.Sleep(5 * time.Millisecond)
		}
	}()
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, a.Process.Signal(syscall.SIGKILL))
	require.Eventually(t, func() bool { p := activePID(); return p != 0 && p != first }, 60*time.Second, 50*time.Millisecond,
		"the standby takes the slot over")
	time.Sleep(300 * time.Millisecond)
	close(stopWriting)
	<-writerDone

	t.Cleanup(func() {
		if t.Failed() {
			var left []int64
			rows, _ := pool.Query(context.Background(), `SELECT id FROM outbox ORDER BY id`)
			for rows.Next() {
				var id int64
				_ = rows.Scan(&id)
				left = append(left, id)
			}
			s, _ := outbox.ReadWALStats(context.Background(), pool, slot, "")
			t.Logf("rows left in the outbox: %v; slot %+v", left, s)
		}
	})
	got := receiveOrdered(t, b, ex+".work", len(all), time.Second)
	seen := map[string]bool{}
	for _, id := range got {
		seen[id] = true
	}
	for _, id := range idStrings(all) {
		require.True(t, seen[id], "id %s lost across the takeover", id)
	}
	require.Eventually(t, func() bool { return walRows(t, pool) == 0 }, 30*time.Second, 50*time.Millisecond)
}

func TestNewRelayWALValidation(t *testing.T) {
	t.Parallel()
	_, err := outbox.NewRelay(outbox.RelayConfig{Pool: &pgxpool.Pool{}, Broker: nopBroker{}, Mode: "tail"})
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	require.ErrorContains(t, err, "Mode")
	_, err = outbox.NewRelay(outbox.RelayConfig{Pool: &pgxpool.Pool{}, Broker: nopBroker{}, Mode: outbox.RelayModeWAL, Slot: "Bad-Slot"})
	require.ErrorContains(t, err, "Slot")
	r, err := outbox.NewRelay(outbox.RelayConfig{Pool: &pgxpool.Pool{}, Broker: nopBroker{}, Mode: outbox.RelayModeWAL, Destination: "orders.v2"})
	require.NoError(t, err)
	require.Equal(t, "ferry_orders_v2", r.Config().Slot)
	require.Equal(t, time.Second, r.Config().StatusInterval)
	require.Equal(t, outbox.DefaultSettleInterval, r.Config().SettleInterval)
	_, err = outbox.NewRelay(outbox.RelayConfig{Pool: &pgxpool.Pool{}, Broker: nopBroker{}, Mode: outbox.RelayModeWAL, SettleInterval: time.Minute})
	require.ErrorContains(t, err, "SettleInterval")
}

// nopBroker is a broker.Broker for NewRelay's validation only.
type nopBroker struct{ broker.Broker }

func (nopBroker) Capabilities() broker.Capabilities { return broker.Capabilities{Name: "nop"} }

// While no relay streams, the slot retains the WAL and the events wait
// as outbox rows: the WAL stats show both, and the stuck-outbox alert,
// which reads the table backlog, fires on them as in poll mode; a relay
// started later publishes them all.
func TestWALRelayBacklogRetainsAndAlerts(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rg := setup(t)
	slot := walSlot(t)
	cfg := outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, Mode: outbox.RelayModeWAL, Slot: slot}
	stop := runRelay(t, newRelay(t, cfg))
	waitStreaming(t, rg.pool, slot)
	stop()

	ids := enqueue(t, rg.pool, events(150, "test.backlog")...)
	w, err := outbox.ReadWALStats(ctx, rg.pool, slot, "")
	require.NoError(t, err)
	require.True(t, w.Exists)
	require.False(t, w.Active)
	require.Positive(t, w.RetainedBytes)
	require.EqualValues(t, 150, w.Unconfirmed)
	require.Positive(t, w.OldestUnconfirmedAge)
	list, err := outbox.ListWALStats(ctx, rg.pool)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, outbox.DefaultDestination, list[0].Destination)

	now := time.Now()
	a, err := alert.New(alert.Config{Threshold: 100, For: time.Minute, Source: func(ctx context.Context) (int, time.Duration, error) {
		s, err := outbox.ReadStats(ctx, rg.pool)
		return int(s.Unprocessed), s.OldestUnprocessedAge, err
	}, Now: func() time.Time { return now }, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.Equal(t, alert.Pending, a.Check(ctx))
	now = now.Add(2 * time.Minute)
	require.Equal(t, alert.Firing, a.Check(ctx))

	runRelay(t, newRelay(t, cfg))
	counts, _ := collect(t, rg.b, rg.queue, len(ids), 200*time.Millisecond)
	require.Len(t, counts, len(ids))
	require.Eventually(t, func() bool { return walRows(t, rg.pool) == 0 }, 30*time.Second, 50*time.Millisecond)
	now = now.Add(time.Minute)
	require.Equal(t, alert.Inactive, a.Check(ctx))
}

// Under concurrent producers every message the stream publishes is its
// own row: the ID, key, body, headers and created-at time (occurred_at)
// of the row (a key and body made unique per event, checked pairwise),
// each event once; an event with an empty body and no headers comes as
// such.
func TestWALRelayMessagesAreTheirRows(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rg := setup(t)
	slot := walSlot(t)
	runRelay(t, newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, Mode: outbox.RelayModeWAL, Slot: slot, BatchSize: 50}))
	waitStreaming(t, rg.pool, slot)
	const producers, each = 4, 250
	type row struct {
		key, created string
	}
	want := map[string]row{} // id -> its row
	var mu sync.Mutex
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			for i := range each {
				k := fmt.Sprintf("p%d-e%d", p, i)
				ev := outbox.Event{Type: "test.rows", Key: k, Body: []byte("body-" + k), Headers: map[string]string{"h": "hv-" + k}}
				if i == 0 {
					ev.Body, ev.Headers = []byte{}, nil
				}
				var occ time.Time
				var ids []int64
				require.NoError(t, pgx.BeginFunc(ctx, rg.pool, func(tx pgx.Tx) error {
					var err error
					if ids, err = outbox.Enqueue(ctx, tx, ev); err != nil {
						return err
					}
					return tx.QueryRow(ctx, `SELECT occurred_at FROM outbox WHERE id = $1`, ids[0]).Scan(&occ)
				}))
				mu.Lock()
				want[strconv.FormatInt(ids[0], 10)] = row{k, broker.FormatTime(occ)}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	counts, msgs := collect(t, rg.b, rg.queue, producers*each, 300*time.Millisecond)
	require.Len(t, counts, producers*each)
	for id, w := range want {
		m := msgs[id]
		require.NotNil(t, m, "id %s", id)
		require.Equal(t, w.key, m.Key, "id %s", id)
		require.Equal(t, w.created, m.Headers[broker.HeaderCreatedAt], "id %s", id)
		if strings.HasSuffix(w.key, "-e0") {
			require.Empty(t, m.Body, "id %s", id)
			require.NotContains(t, m.Headers, "h", "id %s", id)
			continue
		}
		require.Equal(t, "body-"+w.key, string(m.Body), "id %s", id)
		require.Equal(t, "hv-"+w.key, m.Headers["h"], "id %s", id)
	}
}

// ResetWALSlot refuses a slot a relay streams from now (resetting under it
// would hand its unconfirmed events to the polling side while it publishes
// them too) and changes nothing; a slot that does not exist at all is
// ErrNoSlot, not a reset "done".
func TestResetWALSlotRefusesActiveAndMissing(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rg := setup(t)
	slot := walSlot(t)
	r := newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, Mode: outbox.RelayModeWAL, Slot: slot, PollInterval: 100 * time.Millisecond})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	waitStreaming(t, rg.pool, slot)

	_, err := outbox.ResetWALSlot(ctx, rg.pool, slot, "")
	require.ErrorIs(t, err, outbox.ErrSlotActive)
	require.ErrorContains(t, err, "stop the WAL relays")
	var registered, exists bool
	require.NoError(t, rg.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM outbox_wal_slots WHERE slot_name = $1),
		EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND active)`, slot).Scan(&registered, &exists))
	require.True(t, registered, "the registration is kept")
	require.True(t, exists, "the slot is kept and still streamed")
	ids := enqueue(t, rg.pool, events(3, "test.reset")...)
	receiveOrdered(t, rg.b, rg.queue, len(ids), 0) // the relay streams on

	cancel()
	require.NoError(t, <-done)
	// Stopped: the reset goes through.
	_, err = outbox.ResetWALSlot(ctx, rg.pool, slot, "")
	require.NoError(t, err)
	_, err = outbox.ResetWALSlot(ctx, rg.pool, slot, "")
	require.ErrorIs(t, err, outbox.ErrNoSlot, "reset twice: nothing left to reset")
	_, err = outbox.ResetWALSlot(ctx, rg.pool, "ferry_nowhere", "")
	require.ErrorIs(t, err, outbox.ErrNoSlot)
}

// The lanes keep each key's commit order across lanes and batches: three
// producers enqueue keyed events (each key from one producer, so its
// commit order is its id order) and keyless ones while a relay with 4
// lanes, batches of 5 per call and up to 20 per batch, publishes them; an
// AfterPublish hook sleeps a random 0-3 ms after each call, so the lanes
// run out of step. A key split across lanes, or a lane taking its parts
// out of order, shows as a key's events arriving out of order.
func TestWALRelayLanesKeepKeyOrder(t *testing.T) {
	t.Parallel()
	rg := setup(t)
	slot := walSlot(t)
	var inHook, maxInHook atomic.Int32
	r := newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, Mode: outbox.RelayModeWAL, Slot: slot, BatchSize: 5, Concurrency: 4,
		Logger: slog.New(slog.DiscardHandler),
		AfterPublish: func(ctx context.Context, ids []int64) error {
			n := inHook.Add(1)
			for m := maxInHook.Load(); n > m && !maxInHook.CompareAndSwap(m, n); m = maxInHook.Load() {
			}
			time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
			inHook.Add(-1)
			return nil
		}})
	runRelay(t, r)
	waitStreaming(t, rg.pool, slot)

	var (
		mu    sync.Mutex
		keyOf = map[int64]string{}
		all   []int64
		wg    sync.WaitGroup
	)
	for p := range 3 {
		wg.Go(func() {
			for i := range 40 {
				evs := make([]outbox.Event, 1+i%5)
				for j := range evs {
					evs[j] = outbox.Event{Type: "test.lanes", Key: fmt.Sprintf("p%d-k%d", p, (i+j)%6), Body: []byte("x")}
					if (i+j)%7 == 0 {
						evs[j].Key = ""
					}
				}
				ids := enqueue(t, rg.pool, evs...)
				mu.Lock()
				keysOf(keyOf, ids, evs)
				all = append(all, ids...)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.Sort(all)
	got := receiveMessages(t, rg.b, rg.queue, len(all), 300*time.Millisecond)
	requireKeyOrder(t, all, keyOf, got)
	require.Greater(t, maxInHook.Load(), int32(1), "the lanes published at once")
	require.Eventually(t, func() bool { return walRows(t, rg.pool) == 0 }, 30*time.Second, 50*time.Millisecond)
}

// A batch that a lane failed to settle holds the slot's position while
// the other lanes publish later batches: the relay stops (the
// AfterPublish hook fails one lane's call, held until another lane's call
// of a later batch was confirmed, and every call after it, as if the
// relay had crashed there), and then the failed call's rows are still in
// the outbox and its transactions still in the slot's stream (the
// confirmed position did not pass them, although later batches were
// confirmed by the broker); a relay started next publishes them again,
// and nothing is lost or out of order per key.
func TestWALRelayUnsettledBatchHoldsPosition(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rg := setup(t)
	slot := walSlot(t)
	cfg := outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, Mode: outbox.RelayModeWAL, Slot: slot, BatchSize: 4, Concurrency: 4,
		PollInterval: 100 * time.Millisecond}
	require.NoError(t, newRelay(t, cfg).EnsureSlot(ctx))
	// A backlog in the slot's stream: 30 transactions of 4 events over
	// 10 keys, from one producer (commit order is id order). A batch holds
	// at most Concurrency x BatchSize = 16 events.
	keyOf := map[int64]string{}
	var all []int64
	for i := range 30 {
		evs := make([]outbox.Event, 4)
		for j := range evs {
			evs[j] = outbox.Event{Type: "test.hold", Key: fmt.Sprint("k", (4*i+j)%10), Body: []byte("x")}
		}
		ids := enqueue(t, rg.pool, evs...)
		keysOf(keyOf, ids, evs)
		all = append(all, ids...)
	}
	const victimKey = "k3"
	threshold := all[40] // not in the first batches: some are settled before it

	var (
		mu        sync.Mutex
		crashed   bool
		victim    []int64
		laterFrom int64
		laterOK   = make(chan struct{})
		laterSeen bool
		down      = make(chan struct{})
	)
	cfg.AfterPublish = func(ctx context.Context, ids []int64) error {
		mu.Lock()
		if crashed {
			mu.Unlock()
			return errors.New("simulated crash: the relay is down")
		}
		if victim == nil && ids[0] >= threshold && slices.ContainsFunc(ids, func(id int64) bool { return keyOf[id] == victimKey }) {
			victim = slices.Clone(ids)
			// A call whose first id is past the victim's by a batch's
			// worth is of a later batch.
			laterFrom = ids[0] + 16
			mu.Unlock()
			select {
			case <-laterOK:
			case <-time.After(20 * time.Second):
			}
			mu.Lock()
			crashed = true
			mu.Unlock()
			close(down)
			return errors.New("simulated crash after the victim's publish")
		}
		if victim != nil && !laterSeen && ids[0] > laterFrom {
			laterSeen = true
			close(laterOK)
		}
		mu.Unlock()
		return nil
	}
	stop := runRelay(t, newRelay(t, cfg))
	select {
	case <-down:
	case <-time.After(60 * time.Second):
		t.Fatal("no call of the victim's key was published")
	}
	stop()
	mu.Lock()
	require.True(t, laterSeen, "a later batch of another lane was confirmed while the victim's call was held")
	mu.Unlock()

	var left int
	require.NoError(t, rg.pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE id = ANY($1)`, victim).Scan(&left))
	require.Equal(t, len(victim), left, "the failed call's rows are not deleted")
	var victimXIDs, streamXIDs []int64
	rows, err := rg.pool.Query(ctx, `SELECT DISTINCT xmin::text::bigint FROM outbox WHERE id = ANY($1)`, victim)
	require.NoError(t, err)
	victimXIDs, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	rows, err = rg.pool.Query(ctx, `SELECT DISTINCT xid::text::bigint FROM pg_logical_slot_peek_binary_changes($1::text, NULL, NULL, 'proto_version', '1', 'publication_names', $1::text)`, slot)
	require.NoError(t, err)
	streamXIDs, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	for _, x := range victimXIDs {
		require.Contains(t, streamXIDs, x, "the failed call's transaction is still in the slot's stream: the confirmed position did not pass it")
	}

	cfg.AfterPublish = nil
	runRelay(t, newRelay(t, cfg))
	got := receiveMessages(t, rg.b, rg.queue, len(all), 500*time.Millisecond)
	requireKeyOrder(t, all, keyOf, got)
	counts := map[string]int{}
	for _, m := range got {
		counts[m.ID]++
	}
	for _, id := range idStrings(victim) {
		require.GreaterOrEqual(t, counts[id], 2, "id %s: published before the crash and again after", id)
	}
	require.Eventually(t, func() bool { return walRows(t, rg.pool) == 0 }, 30*time.Second, 50*time.Millisecond)
}

// A registered slot missing on a server of another timeline (a promoted
// standby: logical slots are not replicated before PostgreSQL 17) was lost
// by a failover: the relay recovers by itself, hands the rows left to the
// polling side and creates a new slot, and every event arrives exactly
// once. Two relays standing by recover once between them.
func TestWALRelayRecoversSlotLostByFailover(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rg := setup(t)
	slot := walSlot(t)
	cfg := outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, Mode: outbox.RelayModeWAL, Slot: slot, PollInterval: 100 * time.Millisecond}
	stop := runRelay(t, newRelay(t, cfg))
	waitStreaming(t, rg.pool, slot)
	// The registration says where the slot lives.
	var regTL, serverTL int64
	require.NoError(t, rg.pool.QueryRow(ctx, `SELECT timeline_id, ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
FROM outbox_wal_slots WHERE slot_name = $1 AND system_identifier = (SELECT system_identifier FROM pg_control_system())`, slot).Scan(&regTL, &serverTL))
	require.Equal(t, serverTL, regTL)
	first := enqueue(t, rg.pool, events(5, "test.promote")...)
	require.Len(t, receiveOrdered(t, rg.b, rg.queue, len(first), 0), len(first))
	require.Eventually(t, func() bool { return walRows(t, rg.pool) == 0 }, 30*time.Second, 50*time.Millisecond, "the confirmed rows are deleted")
	stop()

	// The events committed while no relay runs are the ones a failover
	// leaves in the table, unconfirmed; the slot is gone and the
	// registration names another timeline, as on a promoted standby.
	left := enqueue(t, rg.pool, events(7, "test.promote")...)
	_, err := rg.pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot)
	require.NoError(t, err)
	_, err = rg.pool.Exec(ctx, `UPDATE outbox_wal_slots SET timeline_id = timeline_id + 1000 WHERE slot_name = $1`, slot)
	require.NoError(t, err)

	logs := &testenv.LockedBuffer{}
	log := slog.New(slog.NewTextHandler(io.MultiWriter(logs, testWriter{t}), &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.Logger = log
	runRelay(t, newRelay(t, cfg))
	runRelay(t, newRelay(t, cfg))
	waitStreaming(t, rg.pool, slot)
	more := enqueue(t, rg.pool, events(4, "test.promote")...)
	all := append(append([]int64(nil), left...), more...)
	got := receiveOrdered(t, rg.b, rg.queue, len(all), 2*time.Second)
	counts := map[string]int{}
	for _, id := range got {
		counts[id]++
	}
	for _, id := range idStrings(all) {
		require.Equal(t, 1, counts[id], "id %s: published once across the failover", id)
	}
	require.Len(t, got, len(all), "nothing else published")
	require.Equal(t, 1, strings.Count(logs.String(), "lost by a failover"), "one relay recovered:\n%s", logs.String())
	require.Contains(t, logs.String(), fmt.Sprintf("old_timeline=%d new_timeline=%d", regTL+1000, serverTL))
	require.Contains(t, logs.String(), "handed_to_polling=7")
	require.NoError(t, rg.pool.QueryRow(ctx, `SELECT timeline_id FROM outbox_wal_slots WHERE slot_name = $1`, slot).Scan(&regTL))
	require.Equal(t, serverTL, regTL, "registered again on this timeline")
	require.Eventually(t, func() bool { return walRows(t, rg.pool) == 0 }, 30*time.Second, 50*time.Millisecond)
}

// A registration from before migration 11 (no timeline) with its slot in
// place gets the timeline at the next start; with its slot missing it is
// ErrSlotLost, as a drop: a failover cannot be told from it.
func TestWALRelayRegistrationWithoutTimeline(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rg := setup(t)
	slot := walSlot(t)
	cfg := outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, Mode: outbox.RelayModeWAL, Slot: slot, PollInterval: 100 * time.Millisecond}
	r := newRelay(t, cfg)
	require.NoError(t, r.EnsureSlot(ctx))
	_, err := rg.pool.Exec(ctx, `UPDATE outbox_wal_slots SET timeline_id = NULL, system_identifier = NULL WHERE slot_name = $1`, slot)
	require.NoError(t, err)
	require.NoError(t, r.EnsureSlot(ctx))
	var filled bool
	require.NoError(t, rg.pool.QueryRow(ctx, `SELECT timeline_id IS NOT NULL AND system_identifier IS NOT NULL FROM outbox_wal_slots WHERE slot_name = $1`, slot).Scan(&filled))
	require.True(t, filled, "the timeline is recorded for an old registration")

	_, err = rg.pool.Exec(ctx, `UPDATE outbox_wal_slots SET timeline_id = NULL WHERE slot_name = $1`, slot)
	require.NoError(t, err)
	_, err = rg.pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot)
	require.NoError(t, err)
	err = r.EnsureSlot(ctx)
	require.ErrorIs(t, err, outbox.ErrSlotLost)
	require.ErrorContains(t, err, "migration 11")
	_, err = outbox.ResetWALSlot(ctx, rg.pool, slot, "")
	require.NoError(t, err)
}
