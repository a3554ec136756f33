package nats_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/internal/procstat"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// A publish ferry gave up on is not held in memory and sent later (issue
// 16, item 3). While the connection is down, nats.go keeps what is
// published in its reconnect buffer (8 MB) and the async PubAck futures
// (until PublishTimeout, 30 s) and sends it all when it reconnects, long
// after the relay's Publish gave up on it. NATS is stopped for 20 s under
// a running relay (PublishTimeout 2 s) with rows of 32 KiB: the Go heap
// stays flat during the outage instead of growing by a batch per probe,
// and every row goes out once NATS is back.
// Not parallel: it stops the shared NATS server.
func TestAbandonedPublishNotKept(t *testing.T) {
	const (
		rows           = 50
		rowBytes       = 32 << 10
		publishTimeout = 2 * time.Second
		outage         = 20 * time.Second
	)
	tp := topology("nats-abandon", "evt.#")
	b := declared(t, tp)
	pool, _ := testenv.NewPool(t)
	require.NoError(t, outbox.Migrate(context.Background(), pool))
	var failedProbes, published atomic.Int64
	r, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Broker: b, Concurrency: 1, PublishTimeout: publishTimeout,
		MaxBackoff: time.Second, Retention: -1,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
		OnBatch: func(s outbox.BatchStats) {
			if s.Err != nil {
				failedProbes.Add(1)
			}
			published.Add(int64(s.Published))
		}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("relay did not stop within 30s of its cancel")
		}
	})
	enqueueBodies(t, pool, 1, 16)
	require.Eventually(t, func() bool { return published.Load() == 1 }, 30*time.Second, 20*time.Millisecond, "the warm-up row is published")

	testenv.Services(t, "stop", "nats")
	started := false
	t.Cleanup(func() {
		if !started {
			testenv.Services(t, "start", "nats")
		}
	})
	stoppedAt := time.Now()
	enqueueBodies(t, pool, rows, rowBytes)
	require.Eventually(t, func() bool { return failedProbes.Load() >= 1 }, 2*publishTimeout+5*time.Second, 20*time.Millisecond,
		"the first publish while NATS is down fails")
	heap0, rss0 := procstat.SelfMemory()
	var heapMax, rssMax uint64
	for time.Since(stoppedAt) < outage {
		time.Sleep(500 * time.Millisecond)
		h, r := procstat.SelfMemory()
		heapMax, rssMax = max(heapMax, h), max(rssMax, r)
	}
	probes := failedProbes.Load()
	testenv.Services(t, "start", "nats")
	started = true
	restarted := time.Now()
	require.Eventually(t, func() bool { return published.Load() == rows+1 }, 60*time.Second, 50*time.Millisecond, "rows go out once NATS is back")
	took := time.Since(restarted)

	batch := uint64(rows * rowBytes)
	heapGrowth := int64(heapMax) - int64(heap0)
	t.Logf("NATS down %v: %d failed probes, heap in use %.1f MB at the first failed probe, growth %+.1f MB (%.2f batches of %.1f MB); RSS %.1f MB, growth %+.1f MB; every row published %v after the restart",
		outage, probes, mb(heap0), float64(heapGrowth)/(1<<20), float64(heapGrowth)/float64(batch), mb(batch), mb(rss0),
		(float64(rssMax)-float64(rss0))/(1<<20), took.Round(10*time.Millisecond))
	require.Less(t, heapGrowth, int64(3*batch), "the Go heap does not grow with each probe during the outage")
}

// enqueueBodies enqueues n rows with bodies of size bytes each.
func enqueueBodies(t *testing.T, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, n, size int) {
	t.Helper()
	ctx := ctxFor(t, 10*time.Second)
	body := bytes.Repeat([]byte("x"), size)
	evs := make([]outbox.Event, n)
	for i := range evs {
		evs[i] = outbox.Event{Type: "evt.abandon", Key: fmt.Sprint("k", i), Body: body}
	}
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = outbox.Enqueue(ctx, tx, evs...)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
}

func mb(n uint64) float64 { return float64(n) / (1 << 20) }
