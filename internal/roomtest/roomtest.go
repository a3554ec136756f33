// Package roomtest is the test of the outbox relay against a broker that
// has no room (issue 29, "No room on the broker"): a RabbitMQ memory
// alarm, a Kafka topic whose leader refuses writes with
// NOT_ENOUGH_REPLICAS, a full JetStream stream. Each adapter's test puts
// its real server in that state and calls Run, which checks what every
// broker must do the same: the relay reports that it is blocked
// (outbox.Relay.Blocked, RelayConfig.OnBlocked) with the broker's reason,
// logs it once rather than once per retry, holds its rows (none marked
// published, none charged an attempt), resumes by itself once the broker
// has room again, and nothing is lost (every outbox row reaches the
// queue).
package roomtest

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// Case is one broker without room.
type Case struct {
	// Broker is connected and has Topology declared.
	Broker   broker.Broker
	Topology broker.Topology
	// Type is an event type the topology routes to its first queue.
	Type string
	// Rows is the number of outbox rows to publish. Defaults to 20.
	Rows int
	// Block puts the broker in the no-room state; called before the
	// rows are enqueued. Unblock gives it room again; the test calls it
	// once the relay reported itself blocked (the caller's own cleanup
	// must undo Block too, for a failing test).
	Block, Unblock func(t *testing.T)
	// Reason, when set, must be part of the reason the relay reports
	// (the broker's own words).
	Reason string
	// PublishTimeout is the relay's. Defaults to 2 s.
	PublishTimeout time.Duration
	// Mode is the relay's RelayConfig.Mode (outbox.RelayModePoll or
	// outbox.RelayModeWAL, which then streams a slot of its own).
	// Defaults to poll.
	Mode string
}

// Result holds the figures Run measured.
type Result struct {
	Reason        string        // what Relay.Blocked reported
	ToBlocked     time.Duration // from the relay's start to Blocked() != ""
	ToResume      time.Duration // from Unblock to every row published
	BlockedLogs   int           // "no room" log lines while blocked (must be 1)
	Received      int           // deliveries taken from the queue
	DistinctIDs   int           // distinct message ids among them
	BlockedProbes int           // failed batches while blocked
}

// Run runs the relay against c and checks the contract; it fails t on any
// breach and returns the figures (also logged).
func Run(t *testing.T, c Case) Result {
	t.Helper()
	if c.Rows == 0 {
		c.Rows = 20
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, _ := testenv.NewPool(t)
	require.NoError(t, outbox.Migrate(ctx, pool))

	var (
		logs     testenv.LockedBuffer
		mu       sync.Mutex
		reports  []string
		failures int
	)
	slot := ""
	if c.Mode == outbox.RelayModeWAL {
		slot = fmt.Sprintf("ferry_room_%d", time.Now().UnixNano()%1e12)
	}
	r, err := outbox.NewRelay(outbox.RelayConfig{
		Pool: pool, Broker: c.Broker, BatchSize: 10, PublishTimeout: c.PublishTimeout,
		MaxBackoff: 200 * time.Millisecond, Retention: -1, Mode: c.Mode, Slot: slot,
		Logger:    slog.New(slog.NewTextHandler(&logs, nil)),
		OnBlocked: func(reason string) { mu.Lock(); reports = append(reports, reason); mu.Unlock() },
		OnBatch: func(s outbox.BatchStats) {
			if s.Err != nil {
				mu.Lock()
				failures++
				mu.Unlock()
			}
		},
	})
	require.NoError(t, err)
	c.Block(t)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- r.Run(rctx) }()
	stopped := false
	stopRelay := func() {
		if !stopped {
			stopped = true
			stop()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				// Fail, with the broker given room again, instead of hanging.
				c.Unblock(t)
				t.Fatalf("the relay did not stop within 30 s of its cancel (a Publish that ignores its ctx?)")
			}
		}
	}
	defer stopRelay()
	defer func() {
		if t.Failed() {
			t.Logf("relay log:\n%s", logs.String())
		}
	}()
	if slot != "" {
		// The stream publishes what is committed after it started.
		require.Eventually(t, func() bool {
			st, err := outbox.ReadWALStats(ctx, pool, slot, "")
			require.NoError(t, err)
			return st.Active
		}, 60*time.Second, 20*time.Millisecond, "the WAL relay streams slot %s", slot)
	}

	evs := make([]outbox.Event, c.Rows)
	for i := range evs {
		evs[i] = outbox.Event{Type: c.Type, Key: fmt.Sprint("k", i%4), Body: []byte(fmt.Sprintf(`{"n":%d}`, i))}
	}
	var ids []int64
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		ids, err = outbox.Enqueue(ctx, tx, evs...)
		return err
	}))
	require.Len(t, ids, c.Rows)

	var res Result
	require.Eventually(t, func() bool { return r.Blocked() != "" }, 30*time.Second, 20*time.Millisecond,
		"the relay never reported itself blocked")
	res.ToBlocked = time.Since(start)
	res.Reason = r.Blocked()
	if c.Reason != "" {
		require.Contains(t, strings.ToLower(res.Reason), strings.ToLower(c.Reason), "the reason is the broker's")
	}
	mu.Lock()
	require.NotEmpty(t, reports)
	require.Equal(t, res.Reason, reports[0], "OnBlocked got the same reason")
	atBlock := failures
	mu.Unlock()

	// Let it retry a few times while the broker still has no room.
	time.Sleep(1500 * time.Millisecond)
	require.Equal(t, res.Reason, r.Blocked(), "still blocked")
	var held, charged int
	// Published rows are marked (poll) or deleted (WAL).
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE processed_at IS NULL), count(*) FILTER (WHERE attempts > 0) FROM outbox`).Scan(&held, &charged))
	require.Equal(t, c.Rows, held, "no row is marked published (or deleted) while the broker has no room")
	require.Zero(t, charged, "no row is charged an attempt (or parked) for a broker without room")
	mu.Lock()
	res.BlockedProbes = failures
	mu.Unlock()
	require.Greater(t, res.BlockedProbes, atBlock, "the relay kept trying while blocked")
	res.BlockedLogs = strings.Count(logs.String(), "the broker has no room")
	require.Equal(t, 1, res.BlockedLogs, "logged once, not once per retry:\n%s", logs.String())

	c.Unblock(t)
	unblocked := time.Now()
	require.Eventually(t, func() bool {
		var left int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE processed_at IS NULL`).Scan(&left))
		return left == 0
	}, 60*time.Second, 50*time.Millisecond, "the relay did not resume by itself")
	res.ToResume = time.Since(unblocked)
	require.Empty(t, r.Blocked(), "no longer blocked")
	mu.Lock()
	require.Equal(t, "", reports[len(reports)-1], "OnBlocked told the end")
	mu.Unlock()
	require.Contains(t, logs.String(), "the broker is no longer blocked")
	stopRelay()

	// 0 lost: every row enqueued is in the queue.
	want := map[string]bool{}
	for _, id := range ids {
		want[fmt.Sprint(id)] = true
	}
	sub, err := c.Broker.Subscribe(ctx, c.Topology.Queues[0].Name, broker.SubscribeOptions{})
	require.NoError(t, err)
	defer sub.Close()
	got := map[string]bool{}
	for len(got) < len(want) {
		dctx, dcancel := context.WithTimeout(ctx, 20*time.Second)
		d, err := sub.Receive(dctx)
		dcancel()
		require.NoError(t, err, "received %d of %d rows", len(got), len(want))
		id := d.Message().ID
		require.True(t, want[id], "message %s is an outbox row", id)
		got[id] = true
		res.Received++
		require.NoError(t, d.Ack(ctx))
	}
	res.DistinctIDs = len(got)
	t.Logf("no room (%s relay): reason %q; blocked after %v, %d failed batches while blocked, %d log line(s); resumed %v after the broker had room; %d rows, %d received (%d distinct), 0 lost",
		r.Config().Mode, res.Reason, res.ToBlocked.Round(time.Millisecond), res.BlockedProbes, res.BlockedLogs, res.ToResume.Round(time.Millisecond), c.Rows, res.Received, res.DistinctIDs)
	return res
}
