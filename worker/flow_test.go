package worker_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/worker"
)

// TestGCRA: a fresh limit lets a burst through at once, then one event
// per interval; the wait it returns is exactly the time until the next
// event may start, and an idle period gives the burst back, no more.
func TestGCRA(t *testing.T) {
	t.Parallel()
	const iv = 50 * time.Millisecond // 20/s
	now := time.Unix(1_700_000_000, 0)
	var tat time.Time
	for i := range 3 {
		ok, next, wait := worker.GCRA(tat, now, iv, 3)
		require.True(t, ok, "event %d of the burst of 3", i)
		require.Zero(t, wait)
		require.Equal(t, now.Add(time.Duration(i+1)*iv), next)
		tat = next
	}
	ok, same, wait := worker.GCRA(tat, now, iv, 3)
	require.False(t, ok, "the 4th at once is over the burst")
	require.Equal(t, tat, same, "a refusal changes nothing")
	require.Equal(t, iv, wait)
	ok, _, wait = worker.GCRA(tat, now.Add(iv-time.Millisecond), iv, 3)
	require.False(t, ok)
	require.Equal(t, time.Millisecond, wait)
	ok, next, _ := worker.GCRA(tat, now.Add(iv), iv, 3)
	require.True(t, ok, "one interval later")
	require.Equal(t, now.Add(4*iv), next)

	// After an idle minute, the burst again, and no more.
	later := now.Add(time.Minute)
	n := 0
	for tat = next; ; n++ {
		ok, next, _ := worker.GCRA(tat, later, iv, 3)
		if !ok {
			break
		}
		tat = next
	}
	require.Equal(t, 3, n)

	// Burst 1: evenly spaced.
	ok, tat, _ = worker.GCRA(time.Time{}, now, iv, 1)
	require.True(t, ok)
	ok, _, wait = worker.GCRA(tat, now.Add(10*time.Millisecond), iv, 1)
	require.False(t, ok)
	require.Equal(t, 40*time.Millisecond, wait)
}

func TestRateLimitValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, (&worker.RateLimit{Rate: 0.5, Burst: 1}).Validate())
	require.Equal(t, 2*time.Second, (&worker.RateLimit{Rate: 0.5, Burst: 1}).Interval())
	require.Equal(t, time.Microsecond, (&worker.RateLimit{Rate: 1e6, Burst: 1}).Interval())
	for _, r := range []worker.RateLimit{{Rate: 0, Burst: 1}, {Rate: -1, Burst: 1}, {Rate: 2e6, Burst: 1}} {
		require.EqualError(t, r.Validate(), fmt.Sprintf("worker: RateLimit.Rate %v: want a rate per second above 0 and at most 1e6", r.Rate))
	}
	require.EqualError(t, (&worker.RateLimit{Rate: 1}).Validate(), "worker: RateLimit.Burst 0: want at least 1")
}

func TestConcurrencyLimitValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, (&worker.ConcurrencyLimit{Limit: 1}).Validate())
	require.EqualError(t, (&worker.ConcurrencyLimit{Limit: 0}).Validate(), "worker: ConcurrencyLimit.Limit 0: want 1..10000")
	require.EqualError(t, (&worker.ConcurrencyLimit{Limit: 10001}).Validate(), "worker: ConcurrencyLimit.Limit 10001: want 1..10000")
	require.EqualError(t, (&worker.ConcurrencyLimit{Limit: 2, Lease: time.Millisecond}).Validate(), "worker: ConcurrencyLimit.Lease 1ms: want at least 1s (0: 30s)")
	require.EqualError(t, worker.TypeOptions{Concurrency: &worker.ConcurrencyLimit{}}.Validate(), "worker: TypeOptions.Concurrency: worker: ConcurrencyLimit.Limit 0: want 1..10000")
	require.False(t, worker.TypeOptions{Rate: &worker.RateLimit{Rate: 1, Burst: 1}}.IsZero())
}

func TestSnoozeError(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("calling the provider: %w", worker.Snooze(3*time.Second))
	require.True(t, worker.IsSnooze(err))
	require.False(t, worker.IsSnooze(worker.RetryAfter(errors.New("x"), time.Second)), "RetryAfter counts; it is not a snooze")
	require.EqualError(t, worker.Snooze(3*time.Second), "worker: snoozed for 3s")
	var s *worker.SnoozeError
	require.ErrorAs(t, err, &s)
	require.Equal(t, 3*time.Second, s.Delay)
}
