package alert_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/alert"
	"github.com/ferrymq/ferry/internal/testenv"
)

// hook is a webhook receiver on loopback that records what it gets and can
// be told to refuse.
type hook struct {
	srv  *httptest.Server
	mu   sync.Mutex
	got  []alert.Notification
	fail bool
}

func newHook(t *testing.T) *hook {
	h := &hook{}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.fail {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		var n alert.Notification
		if err := json.NewDecoder(r.Body).Decode(&n); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		h.got = append(h.got, n)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hook) setFail(v bool) { h.mu.Lock(); h.fail = v; h.mu.Unlock() }

func (h *hook) statuses() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var s []string
	for _, n := range h.got {
		s = append(s, n.Status)
	}
	return s
}

func (h *hook) notifications() []alert.Notification {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]alert.Notification(nil), h.got...)
}

// shared is a backlog every Alert of a test reads, like the outbox table
// all relays share.
type shared struct{ n atomic.Int64 }

func (s *shared) source(context.Context) (int, time.Duration, error) { return int(s.n.Load()), 0, nil }

// pooled is the setup of the one-per-database tests.
type pooled struct {
	pool    *pgxpool.Pool
	hook    *hook
	backlog *shared
	logs    *syncBuffer
}

func setupPooled(t *testing.T) *pooled {
	t.Helper()
	pool, _ := testenv.NewPool(t)
	p := &pooled{pool: pool, hook: newHook(t), backlog: &shared{}, logs: &syncBuffer{}}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("alert logs:\n%s", p.logs.String())
		}
	})
	return p
}

// newAlert returns an Alert on the test's database posting to its hook;
// now is its clock (nil: time.Now). It is closed when the test ends.
func (p *pooled) newAlert(t *testing.T, instance string, now func() time.Time) *alert.Alert {
	t.Helper()
	w, err := alert.NewWebhook(p.hook.srv.URL)
	require.NoError(t, err)
	a, err := alert.New(alert.Config{
		Threshold: 1, For: 100 * time.Millisecond, Interval: 20 * time.Millisecond,
		Notifiers: []alert.Notifier{w},
		Source:    p.backlog.source,
		Pool:      p.pool,
		Now:       now,
		Logger:    slog.New(slog.NewTextHandler(p.logs, nil)).With("instance", instance),
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	return a
}

// run runs a until the returned stop is called; stop waits for Run.
func run(t *testing.T, a *alert.Alert) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			require.ErrorIs(t, err, context.Canceled)
		case <-time.After(30 * time.Second):
			t.Fatal("alert: Run did not return")
		}
	}
	t.Cleanup(stop)
	return stop
}

// storedState reads the alert's row of ferry_alerts.
func storedState(t *testing.T, pool *pgxpool.Pool) (state string, since, fired, resolved *time.Time) {
	t.Helper()
	err := pool.QueryRow(context.Background(),
		`SELECT state, since, fired_at, resolved_at FROM ferry_alerts WHERE name = $1`, alert.DefaultName).
		Scan(&state, &since, &fired, &resolved)
	require.NoError(t, err)
	return state, since, fired, resolved
}

// TestPoolTwoInstancesNotifyOnceAndSuccessorResolves: two Alerts on one
// database (two relay replicas) send one "firing" between them; when the
// leader stops and the backlog drains, the other sends one "resolved".
func TestPoolTwoInstancesNotifyOnceAndSuccessorResolves(t *testing.T) {
	p := setupPooled(t)
	a1, a2 := p.newAlert(t, "a1", nil), p.newAlert(t, "a2", nil)
	p.backlog.n.Store(5)
	stop1, stop2 := run(t, a1), run(t, a2)

	require.Eventually(t, func() bool { return len(p.hook.statuses()) >= 1 }, 10*time.Second, 5*time.Millisecond)
	// Many more ticks of both instances (For is 5 ticks): still one.
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, []string{"firing"}, p.hook.statuses(), "one notification per database, not per process")
	require.NotEqual(t, a1.Leading(), a2.Leading(), "exactly one leader")
	state, since, fired, _ := storedState(t, p.pool)
	require.Equal(t, "firing", state)
	require.NotNil(t, since)
	require.NotNil(t, fired)

	leader, other, stopLeader, stopOther := a1, a2, stop1, stop2
	if a2.Leading() {
		leader, other, stopLeader, stopOther = a2, a1, stop2, stop1
	}
	stopLeader()
	require.False(t, leader.Leading())
	p.backlog.n.Store(0)

	require.Eventually(t, func() bool { return len(p.hook.statuses()) >= 2 }, 10*time.Second, 5*time.Millisecond)
	require.True(t, other.Leading())
	time.Sleep(200 * time.Millisecond)
	require.Equal(t, []string{"firing", "resolved"}, p.hook.statuses())
	got := p.hook.notifications()
	require.True(t, got[0].StartsAt.Equal(got[1].StartsAt), "the successor continues the same incident")
	require.Equal(t, 0, got[1].Count)
	stopOther()

	state, since, _, resolved := storedState(t, p.pool)
	require.Equal(t, "inactive", state)
	require.Nil(t, since)
	require.NotNil(t, resolved)
}

// TestPoolNewInstanceResolvesStoredFiring: a relay fired and was stopped;
// a replacement started once the backlog is under the threshold sends the
// "resolved" the stopped one never sent.
func TestPoolNewInstanceResolvesStoredFiring(t *testing.T) {
	p := setupPooled(t)
	p.backlog.n.Store(5)
	stop1 := run(t, p.newAlert(t, "old", nil))
	require.Eventually(t, func() bool { return len(p.hook.statuses()) >= 1 }, 10*time.Second, 5*time.Millisecond)
	stop1()
	p.backlog.n.Store(0)
	time.Sleep(100 * time.Millisecond)
	require.Equal(t, []string{"firing"}, p.hook.statuses())

	fresh := p.newAlert(t, "new", nil)
	run(t, fresh)
	require.Eventually(t, func() bool { return len(p.hook.statuses()) >= 2 }, 10*time.Second, 5*time.Millisecond)
	time.Sleep(200 * time.Millisecond)
	require.Equal(t, []string{"firing", "resolved"}, p.hook.statuses())
	require.NotContains(t, p.logs.String(), "before For elapsed")
}

// TestPoolPendingSinceSurvivesLeaderChange: For is measured from when the
// backlog first went above the threshold, not from the new leader's start.
func TestPoolPendingSinceSurvivesLeaderChange(t *testing.T) {
	p := setupPooled(t)
	ctx := context.Background()
	clk := newClock()
	a1, a2 := p.newAlert(t, "a1", clk.now), p.newAlert(t, "a2", clk.now)
	t0 := clk.now()

	p.backlog.n.Store(5)
	require.Equal(t, alert.Pending, a1.Check(ctx))
	require.True(t, a1.Leading())
	require.Equal(t, alert.Inactive, a2.Check(ctx), "a follower evaluates nothing")
	require.False(t, a2.Leading())

	clk.add(60 * time.Millisecond)
	require.NoError(t, a1.Close())
	require.False(t, a1.Leading())
	require.Equal(t, alert.Pending, a2.Check(ctx), "still pending: For counts from t0")
	require.True(t, a2.Leading())
	require.Equal(t, alert.Inactive, a1.Check(ctx), "a1 follows now")
	require.Empty(t, p.hook.statuses())

	clk.add(40 * time.Millisecond) // t0 + For
	require.Equal(t, alert.Firing, a2.Check(ctx))
	require.Equal(t, []string{"firing"}, p.hook.statuses())
	n := p.hook.notifications()[0]
	require.True(t, n.StartsAt.Equal(t0), "starts_at %s, want %s", n.StartsAt, t0)
	require.True(t, n.At.Equal(t0.Add(100*time.Millisecond)))
}

// TestPoolLeaderConnectionLost: when the session holding the lock dies, the
// old leader notices and stops leading; the next leader continues the
// firing alert without repeating it and resolves it once.
func TestPoolLeaderConnectionLost(t *testing.T) {
	p := setupPooled(t)
	ctx := context.Background()
	clk := newClock()
	a1, a2 := p.newAlert(t, "a1", clk.now), p.newAlert(t, "a2", clk.now)

	p.backlog.n.Store(5)
	require.Equal(t, alert.Pending, a1.Check(ctx))
	clk.add(time.Second)
	require.Equal(t, alert.Firing, a1.Check(ctx))
	require.Equal(t, []string{"firing"}, p.hook.statuses())

	var killed bool
	require.NoError(t, p.pool.QueryRow(ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks
		WHERE locktype = 'advisory' AND classid = $1 AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
		alert.LockClassID).Scan(&killed))
	require.True(t, killed)

	require.Eventually(t, func() bool { a2.Check(ctx); return a2.Leading() }, 10*time.Second, 10*time.Millisecond,
		"the lock of the killed session is free")
	require.Equal(t, alert.Firing, a2.Check(ctx))
	require.Equal(t, alert.Inactive, a1.Check(ctx), "a1 finds its connection dead and follows")
	require.False(t, a1.Leading())
	require.Contains(t, p.logs.String(), "leadership lost")
	require.Equal(t, []string{"firing"}, p.hook.statuses(), "not fired again")

	p.backlog.n.Store(0)
	clk.add(time.Second)
	require.Equal(t, alert.Inactive, a2.Check(ctx))
	require.Equal(t, alert.Inactive, a2.Check(ctx))
	require.Equal(t, []string{"firing", "resolved"}, p.hook.statuses())
}

// TestPoolUndeliveredNotificationGoesToSuccessor: the leader's "firing"
// could not be delivered before it stopped; it was saved with the state,
// so the next leader delivers it (at-least-once), then resolves.
func TestPoolUndeliveredNotificationGoesToSuccessor(t *testing.T) {
	p := setupPooled(t)
	ctx := context.Background()
	clk := newClock()
	a1, a2 := p.newAlert(t, "a1", clk.now), p.newAlert(t, "a2", clk.now)

	p.hook.setFail(true)
	p.backlog.n.Store(5)
	a1.Check(ctx)
	clk.add(time.Second)
	require.Equal(t, alert.Firing, a1.Check(ctx))
	require.Empty(t, p.hook.statuses())
	require.NoError(t, a1.Close())

	p.hook.setFail(false)
	require.Equal(t, alert.Firing, a2.Check(ctx))
	require.Equal(t, []string{"firing"}, p.hook.statuses())
	require.True(t, p.hook.notifications()[0].At.Equal(clk.now()), "the stored notification, not a new one")
	require.Equal(t, alert.Firing, a2.Check(ctx))
	require.Equal(t, []string{"firing"}, p.hook.statuses(), "delivered once")

	p.backlog.n.Store(0)
	require.Equal(t, alert.Inactive, a2.Check(ctx))
	require.Equal(t, []string{"firing", "resolved"}, p.hook.statuses())
}

// TestPoolStalePendingIsReevaluated: a "pending" stored by a relay long
// gone (last checked ten minutes ago, backlog unknown since) does not make
// a new leader fire at once: the new leader re-evaluates from now, and
// fires only after For of its own observations. A row without checked_at
// (written before the column existed) is stale too.
func TestPoolStalePendingIsReevaluated(t *testing.T) {
	for _, tc := range []struct {
		name  string
		stale func(t *testing.T, p *pooled, clk *clock)
	}{
		{"CheckedLongAgo", func(t *testing.T, p *pooled, clk *clock) { clk.add(10 * time.Minute) }},
		{"NeverChecked", func(t *testing.T, p *pooled, clk *clock) {
			_, err := p.pool.Exec(context.Background(), `UPDATE ferry_alerts SET checked_at = NULL`)
			require.NoError(t, err)
			clk.add(time.Second)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := setupPooled(t)
			ctx := context.Background()
			clk := newClock()
			a1 := p.newAlert(t, "gone", clk.now)
			p.backlog.n.Store(5)
			require.Equal(t, alert.Pending, a1.Check(ctx))
			require.NoError(t, a1.Close())
			tc.stale(t, p, clk)

			a2 := p.newAlert(t, "new", clk.now)
			t1 := clk.now()
			require.Equal(t, alert.Pending, a2.Check(ctx), "a stale pending is re-evaluated, not trusted")
			require.Empty(t, p.hook.statuses())
			require.Contains(t, p.logs.String(), "stored pending state is stale")
			_, since, _, _ := storedState(t, p.pool)
			require.NotNil(t, since)
			require.True(t, since.Equal(t1), "For counts from the new leader's first observation")

			clk.add(100 * time.Millisecond) // For
			require.Equal(t, alert.Firing, a2.Check(ctx))
			require.Equal(t, []string{"firing"}, p.hook.statuses())
		})
	}
}
