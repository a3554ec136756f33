package alert_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/alert"
)

// clock is a fake clock moved by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time                   { return c.t }
func (c *clock) add(d time.Duration)              { c.t = c.t.Add(d) }
func newClock() *clock                            { return &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }
func (c *clock) since(t0 time.Time) time.Duration { return c.t.Sub(t0) }

// backlog is a Source whose answer the test sets.
type backlog struct {
	mu     sync.Mutex
	count  int
	oldest time.Duration
	err    error
	calls  int
}

func (b *backlog) set(count int) { b.mu.Lock(); b.count = count; b.err = nil; b.mu.Unlock() }
func (b *backlog) source(ctx context.Context) (int, time.Duration, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls++
	return b.count, b.oldest, b.err
}

// recorder is a Notifier that keeps what it was sent and can be told to fail.
type recorder struct {
	mu   sync.Mutex
	got  []alert.Notification
	fail error
}

func (r *recorder) String() string { return "recorder" }
func (r *recorder) Notify(ctx context.Context, n alert.Notification) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return r.fail
	}
	r.got = append(r.got, n)
	return nil
}
func (r *recorder) statuses() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var s []string
	for _, n := range r.got {
		s = append(s, n.Status)
	}
	return s
}

type bundle struct {
	clock *clock
	src   *backlog
	rec   *recorder
	logs  *syncBuffer
	alert *alert.Alert
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func setup(t *testing.T, cfg alert.Config) *bundle {
	t.Helper()
	b := &bundle{clock: newClock(), src: &backlog{}, rec: &recorder{}, logs: &syncBuffer{}}
	cfg.Source = b.src.source
	cfg.Now = b.clock.now
	cfg.Notifiers = append(cfg.Notifiers, b.rec)
	cfg.Logger = slog.New(slog.NewTextHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	a, err := alert.New(cfg)
	require.NoError(t, err)
	b.alert = a
	return b
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	a, err := alert.New(alert.Config{Source: (&backlog{}).source})
	require.NoError(t, err)
	c := a.Config()
	require.Equal(t, 100, c.Threshold)
	require.Equal(t, 5*time.Minute, c.For)
	require.Equal(t, 15*time.Second, c.Interval)
	require.Equal(t, "FerryOutboxStuck", c.Name)
	require.Equal(t, alert.Inactive, a.State())
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	src := (&backlog{}).source
	for name, cfg := range map[string]alert.Config{
		"Source":    {},
		"Threshold": {Source: src, Threshold: -1},
		"For":       {Source: src, For: -time.Second},
		"Interval":  {Source: src, Interval: -time.Second},
		"Notifiers": {Source: src, Notifiers: []alert.Notifier{nil}},
	} {
		_, err := alert.New(cfg)
		require.ErrorIs(t, err, alert.ErrConfig, name)
		require.Contains(t, err.Error(), name)
	}
}

func TestFiresOnceAfterForAndResolvesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, alert.Config{Labels: map[string]string{"broker": "rabbitmq"}})
	ctx := context.Background()

	b.src.set(150)
	b.src.oldest = 7 * time.Minute
	start := b.clock.now()
	require.Equal(t, alert.Pending, b.alert.Check(ctx))
	for b.clock.since(start) < 5*time.Minute-15*time.Second {
		b.clock.add(15 * time.Second)
		require.Equal(t, alert.Pending, b.alert.Check(ctx), "at %s", b.clock.since(start))
	}
	require.Empty(t, b.rec.statuses(), "nothing is sent while pending")

	b.clock.add(15 * time.Second) // exactly For after the first observation
	require.Equal(t, alert.Firing, b.alert.Check(ctx))
	require.Equal(t, []string{"firing"}, b.rec.statuses())
	n := b.rec.got[0]
	require.Equal(t, "FerryOutboxStuck", n.Alert)
	require.Equal(t, 150, n.Count)
	require.Equal(t, 100, n.Threshold)
	require.Equal(t, 300.0, n.ForSeconds)
	require.Equal(t, 420.0, n.OldestAgeSeconds)
	require.Equal(t, start, n.StartsAt)
	require.Equal(t, start.Add(5*time.Minute), n.At)
	require.Equal(t, map[string]string{"broker": "rabbitmq"}, n.Labels)
	require.Contains(t, n.Summary, "150 unprocessed outbox rows")
	require.Contains(t, b.logs.String(), "level=ERROR msg=\"alert: firing")

	// Many more ticks above the threshold: no repeat.
	for range 40 {
		b.clock.add(15 * time.Second)
		b.src.set(150 + 10)
		require.Equal(t, alert.Firing, b.alert.Check(ctx))
	}
	require.Equal(t, []string{"firing"}, b.rec.statuses())
	require.Equal(t, 1, strings.Count(b.logs.String(), "level=ERROR"))

	// Back to the threshold (not above): resolved once.
	b.src.set(100)
	b.clock.add(15 * time.Second)
	require.Equal(t, alert.Inactive, b.alert.Check(ctx))
	require.Equal(t, []string{"firing", "resolved"}, b.rec.statuses())
	require.Equal(t, 100, b.rec.got[1].Count)
	for range 10 {
		b.clock.add(15 * time.Second)
		require.Equal(t, alert.Inactive, b.alert.Check(ctx))
	}
	require.Equal(t, []string{"firing", "resolved"}, b.rec.statuses())

	// A new incident fires again.
	b.src.set(101)
	require.Equal(t, alert.Pending, b.alert.Check(ctx))
	b.clock.add(5 * time.Minute)
	require.Equal(t, alert.Firing, b.alert.Check(ctx))
	require.Equal(t, []string{"firing", "resolved", "firing"}, b.rec.statuses())
}

func TestThresholdEdge(t *testing.T) {
	t.Parallel()
	b := setup(t, alert.Config{Threshold: 10, For: time.Minute})
	ctx := context.Background()

	b.src.set(10) // equal is not above
	for range 10 {
		require.Equal(t, alert.Inactive, b.alert.Check(ctx))
		b.clock.add(time.Minute)
	}
	b.src.set(11)
	require.Equal(t, alert.Pending, b.alert.Check(ctx))
	b.clock.add(time.Minute - time.Nanosecond)
	require.Equal(t, alert.Pending, b.alert.Check(ctx))
	b.clock.add(time.Nanosecond)
	require.Equal(t, alert.Firing, b.alert.Check(ctx))
	require.Equal(t, []string{"firing"}, b.rec.statuses())
}

func TestPendingDropsSilently(t *testing.T) {
	t.Parallel()
	b := setup(t, alert.Config{})
	ctx := context.Background()

	b.src.set(500)
	require.Equal(t, alert.Pending, b.alert.Check(ctx))
	b.clock.add(4 * time.Minute)
	b.src.set(3)
	require.Equal(t, alert.Inactive, b.alert.Check(ctx))
	// The For window restarts: 4 more minutes above is not enough.
	b.src.set(500)
	require.Equal(t, alert.Pending, b.alert.Check(ctx))
	b.clock.add(4 * time.Minute)
	require.Equal(t, alert.Pending, b.alert.Check(ctx))
	require.Empty(t, b.rec.statuses())
}

func TestSourceErrorKeepsState(t *testing.T) {
	t.Parallel()
	b := setup(t, alert.Config{For: time.Minute})
	ctx := context.Background()

	b.src.set(500)
	b.alert.Check(ctx)
	b.clock.add(time.Minute)
	require.Equal(t, alert.Firing, b.alert.Check(ctx))

	b.src.mu.Lock()
	b.src.count, b.src.err = 0, errors.New("connection refused")
	b.src.mu.Unlock()
	b.clock.add(time.Minute)
	require.Equal(t, alert.Firing, b.alert.Check(ctx), "an unreadable backlog does not resolve")
	require.Contains(t, b.logs.String(), "connection refused")
	require.Equal(t, []string{"firing"}, b.rec.statuses())
}

func TestNotifierFailureRetriedOnNextTick(t *testing.T) {
	t.Parallel()
	ok := &recorder{}
	b := setup(t, alert.Config{For: time.Minute, Notifiers: []alert.Notifier{ok}})
	ctx := context.Background()
	b.rec.fail = errors.New("receiver down")

	b.src.set(500)
	b.alert.Check(ctx)
	b.clock.add(time.Minute)
	require.Equal(t, alert.Firing, b.alert.Check(ctx))
	require.Equal(t, []string{"firing"}, ok.statuses(), "a failing notifier does not hold back the others")
	require.Empty(t, b.rec.statuses())
	require.Contains(t, b.logs.String(), "receiver down")

	b.clock.add(15 * time.Second)
	b.alert.Check(ctx)
	require.Empty(t, b.rec.statuses(), "still failing")

	// It resolves while the receiver is down: both are kept, in order.
	b.src.set(0)
	b.clock.add(15 * time.Second)
	require.Equal(t, alert.Inactive, b.alert.Check(ctx))
	require.Equal(t, []string{"firing", "resolved"}, ok.statuses())

	b.rec.mu.Lock()
	b.rec.fail = nil
	b.rec.mu.Unlock()
	b.clock.add(15 * time.Second)
	b.alert.Check(ctx)
	require.Equal(t, []string{"firing", "resolved"}, b.rec.statuses())
	b.clock.add(15 * time.Second)
	b.alert.Check(ctx)
	require.Equal(t, []string{"firing", "resolved"}, b.rec.statuses(), "delivered once")
	require.Equal(t, []string{"firing", "resolved"}, ok.statuses())
}

type panicker struct{}

func (panicker) String() string                                   { return "panicker" }
func (panicker) Notify(context.Context, alert.Notification) error { panic("boom") }

func TestNotifierPanicIsAnError(t *testing.T) {
	t.Parallel()
	b := setup(t, alert.Config{For: time.Minute, Notifiers: []alert.Notifier{panicker{}}})
	ctx := context.Background()
	b.src.set(500)
	b.alert.Check(ctx)
	b.clock.add(time.Minute)
	require.Equal(t, alert.Firing, b.alert.Check(ctx))
	require.Contains(t, b.logs.String(), "panicked: boom")
	require.Equal(t, []string{"firing"}, b.rec.statuses())
}

func TestQueueBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, alert.Config{For: time.Nanosecond})
	ctx := context.Background()
	b.rec.fail = errors.New("down")
	for range alert.MaxQueued/2 + 2 {
		b.src.set(500)
		require.Equal(t, alert.Pending, b.alert.Check(ctx))
		b.clock.add(time.Second)
		require.Equal(t, alert.Firing, b.alert.Check(ctx))
		b.src.set(0)
		b.clock.add(time.Second)
		require.Equal(t, alert.Inactive, b.alert.Check(ctx))
	}
	require.Contains(t, b.logs.String(), "dropping the oldest")
	b.rec.mu.Lock()
	b.rec.fail = nil
	b.rec.mu.Unlock()
	b.alert.Check(ctx)
	require.Len(t, b.rec.statuses(), alert.MaxQueued)
	require.Equal(t, "resolved", b.rec.statuses()[alert.MaxQueued-1])
}

func TestRunStopsOnCancel(t *testing.T) {
	t.Parallel()
	src := &backlog{}
	a, err := alert.New(alert.Config{Source: src.source, Interval: time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	require.Eventually(t, func() bool {
		src.mu.Lock()
		defer src.mu.Unlock()
		return src.calls >= 3
	}, 5*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
}
