package console_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/cmd/ferry/ferrycli"
	"github.com/ferrymq/ferry/console"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// limitedJob is the payload of the limits browser test's jobs.
type limitedJob struct{ N int }

// TestLimitsPageInBrowser drives the limits page in headless Chromium
// against a real limit (RabbitMQ; the page reads only PostgreSQL): with
// nothing held the page, reached from the navigation, shows its empty
// state. A handler under WithConcurrency(1) that blocks holds the only
// slot while the second job waits (snoozed): the page shows the slot's
// holder as the worker wrote it, the waiting message under its consumer
// with no last error, and, next to them, a lease expired by a dead worker
// and a throttled rate limit (rows written as the worker writes them).
// Once the handler is let go both jobs are handled, their slot is
// released, and the page is empty again. Screenshots are saved (the path
// is logged).
func TestLimitsPageInBrowser(t *testing.T) {
	browser := newBrowser(t)
	dir := artefacts(t)
	bu := setup(t, "", console.Config{})

	tab, cancel := chromedp.NewContext(browser)
	defer cancel()
	tab, cancelT := context.WithTimeout(tab, 3*time.Minute)
	defer cancelT()
	shot := func(name string) {
		t.Helper()
		buf, err := chromedp.Run(tab, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), buf, 0o644))
		t.Logf("screenshot %s", filepath.Join(dir, name))
	}
	text := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(tab, chromedp.Text(chromedp.CSS(sel)))
		require.NoError(t, err, "text of %s", sel)
		return v
	}

	// Empty, reached from the navigation.
	require.NoError(t, chromedp.Do(tab,
		chromedp.Navigate(bu.base+"/"),
		chromedp.WaitVisible(chromedp.CSS(`header nav`)),
		chromedp.Click(chromedp.CSS(`header nav a[href$="/limits"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#none`)),
	))
	require.Contains(t, text(`#none`), "No limit has any state on this database")
	require.Contains(t, text(`#none`), "ferry.WithConcurrency")
	shot("limits-empty.png")

	// A real limit: one slot, held by a handler that waits to be let go.
	ctx := bu.ctx
	b, err := ferrycli.OpenBroker(ctx, "rabbitmq", brokerOptions())
	if err != nil {
		testenv.Require(t, "rabbitmq")
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	pcfg, err := pgxpool.ParseConfig(bu.dbURL)
	require.NoError(t, err)
	pcfg.MaxConns = 8 // the handler's transaction, the slot's statements, the snoozes, the relay
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	ex := testenv.UniqueName("limits")
	queue := ex + ".jobs"
	letGo := make(chan struct{})
	handled := make(chan string, 2)
	mux := ferry.NewMux()
	require.NoError(t, ferry.Handle(mux, "job.limited", func(ctx context.Context, _ pgx.Tx, j *ferry.Job[limitedJob]) error {
		select {
		case <-letGo:
		case <-ctx.Done():
			return ctx.Err()
		}
		handled <- j.ID
		return nil
	}, ferry.WithConcurrency(1, ferry.LimitName("render/one-at-a-time"), ferry.WithLimitDelay(200*time.Millisecond))))
	p, err := ferry.New(ferry.Config{Pool: pool, Broker: b,
		Topology: broker.Topology{Exchange: ex, Queues: []broker.Queue{{Name: queue, Bindings: []string{"job.limited"}, RetryDelays: []time.Duration{time.Second}}}},
		Relay:    &outbox.RelayConfig{PollInterval: 100 * time.Millisecond},
		Workers:  []worker.Config{{Queue: queue, Router: mux, Concurrency: 2}},
		Logger:   slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(rctx) }()
	release := sync.OnceFunc(func() { close(letGo) })
	stopRun := sync.OnceFunc(func() {
		release()
		stop()
		<-done
	})
	t.Cleanup(stopRun)
	var ids []int64
	require.NoError(t, pgx.BeginFunc(ctx, bu.pool, func(tx pgx.Tx) error {
		for i := range 2 {
			id, err := ferry.Enqueue(ctx, tx, "job.limited", limitedJob{N: i})
			if err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return nil
	}))

	// Wait for the holder and the waiter, as the worker recorded them.
	var holder, waiting string
	require.Eventually(t, func() bool {
		err := bu.pool.QueryRow(ctx, `SELECT holder FROM worker_flow_slots WHERE limit_name = 'render/one-at-a-time' AND holder <> '' AND expires_at > now()`).Scan(&holder)
		if err != nil {
			return false
		}
		err = bu.pool.QueryRow(ctx, `SELECT message_id FROM worker_attempts WHERE consumer = $1 AND snoozes > 0 AND NOT dead`, queue).Scan(&waiting)
		return err == nil
	}, time.Minute, 50*time.Millisecond, "one job holds the slot, the other is snoozed")
	require.Contains(t, []string{strconv.FormatInt(ids[0], 10), strconv.FormatInt(ids[1], 10)}, waiting)
	t.Logf("holder %q, waiting message %s", holder, waiting)
	// Beside them: a slot a dead worker held (its lease ran out) and a
	// throttled rate limit, written as the worker writes them.
	_, err = bu.pool.Exec(ctx, `INSERT INTO worker_flow_slots (limit_name, key, slot, holder, acquired_at, expires_at)
VALUES ('mailer/invoice.send', 'acme', 0, 'dead-host:4242:977:9f8e7d6c5b4a', now() - interval '95 seconds', now() - interval '65 seconds')`)
	require.NoError(t, err)
	_, err = bu.pool.Exec(ctx, `INSERT INTO worker_flow_rates (limit_name, key, tat) VALUES ('provider.call', '', now() + interval '1500 milliseconds')`)
	require.NoError(t, err)

	require.NoError(t, chromedp.Do(tab,
		chromedp.Reload(),
		chromedp.WaitVisible(chromedp.CSS(`#slots`)),
		chromedp.WaitVisible(chromedp.CSS(`#waiters`)),
	))
	slots := text(`#slots`)
	require.Contains(t, slots, "render/one-at-a-time")
	require.Contains(t, slots, holder, "the holder is shown as text")
	require.Contains(t, slots, "1 held")
	require.Contains(t, slots, "dead-host:4242:977:9f8e7d6c5b4a")
	expired, err := chromedp.Run(tab, chromedp.Evaluate[string](`document.querySelector('#slots tr.slot.expired').innerText`))
	require.NoError(t, err)
	require.Contains(t, expired, "dead-host:4242:977:9f8e7d6c5b4a")
	require.Contains(t, expired, "expired")
	require.Contains(t, text(`#rates`), "throttled")
	waiters := text(`#waiters`)
	require.Contains(t, waiters, "consumer "+queue)
	require.Contains(t, waiters, "1 message(s) waiting")
	require.Contains(t, waiters, waiting, "the waiting message is shown")
	require.Contains(t, waiters, "none: no attempt failed", "a snooze writes no last error")
	require.Contains(t, text(`#last-error-note`), "a snooze writes no error")
	on, err := chromedp.Run(tab, chromedp.Text(chromedp.CSS(`header nav a.on`)))
	require.NoError(t, err)
	require.Equal(t, "Limits", strings.TrimSpace(on))
	shot("limits.png")

	// Let the handler go: both are handled, the slot is released (the
	// worker expires it in place), and nothing waits.
	release()
	for range 2 {
		select {
		case <-handled:
		case <-time.After(time.Minute):
			t.Fatal("the jobs were not handled after the handler was let go")
		}
	}
	_, err = bu.pool.Exec(ctx, `DELETE FROM worker_flow_slots WHERE limit_name = 'mailer/invoice.send'; DELETE FROM worker_flow_rates`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		if _, err := chromedp.Run(tab, chromedp.Reload()); err != nil {
			return false
		}
		n, err := chromedp.Run(tab, chromedp.Evaluate[int](`document.querySelectorAll('#none').length`))
		return err == nil && n == 1
	}, 30*time.Second, 200*time.Millisecond, "the page is empty again once both are handled")
	var released int
	require.NoError(t, bu.pool.QueryRow(ctx, `SELECT count(*) FROM worker_flow_slots WHERE limit_name = 'render/one-at-a-time' AND holder = ''`).Scan(&released))
	require.Equal(t, 1, released, "the released slot's row is still there, expired in place, and not shown")
	stopRun()
}
