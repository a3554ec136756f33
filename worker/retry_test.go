package worker_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/worker"
)

func TestBackoffPolicyDefaults(t *testing.T) {
	t.Parallel()
	p := worker.BackoffPolicy{}
	for attempt := 1; attempt < worker.DefaultMaxAttempts; attempt++ {
		d, retry := p.NextRetry(attempt, errors.New("x"))
		require.True(t, retry, "attempt %d", attempt)
		require.Equal(t, 30*time.Second, d, "attempt %d", attempt)
	}
	_, retry := p.NextRetry(worker.DefaultMaxAttempts, errors.New("x"))
	require.False(t, retry, "the 5th failed attempt is the last")
	_, retry = p.NextRetry(worker.DefaultMaxAttempts+3, errors.New("x"))
	require.False(t, retry, "attempts past the maximum (redeliveries counted by the broker) go to the DLQ")
	require.Equal(t, []time.Duration{30 * time.Second}, p.RetryDelays())
}

func TestBackoffPolicyList(t *testing.T) {
	t.Parallel()
	p := worker.BackoffPolicy{MaxAttempts: 6, Delays: []time.Duration{time.Second, 10 * time.Second, time.Minute}}
	want := []time.Duration{time.Second, 10 * time.Second, time.Minute, time.Minute, time.Minute}
	for i, w := range want {
		d, retry := p.NextRetry(i+1, nil)
		require.True(t, retry)
		require.Equal(t, w, d, "delay after attempt %d", i+1)
	}
	_, retry := p.NextRetry(6, nil)
	require.False(t, retry)
	d, retry := p.NextRetry(0, nil)
	require.True(t, retry, "an unset attempt counts as the first")
	require.Equal(t, time.Second, d)
}

func TestBackoffPolicyOneAttempt(t *testing.T) {
	t.Parallel()
	_, retry := worker.BackoffPolicy{MaxAttempts: 1}.NextRetry(1, nil)
	require.False(t, retry)
}

func TestBackoffPolicyValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, worker.BackoffPolicy{}.Validate())
	err := worker.BackoffPolicy{MaxAttempts: -1}.Validate()
	require.ErrorContains(t, err, "MaxAttempts")
	err = worker.BackoffPolicy{Delays: []time.Duration{time.Second, 0}}.Validate()
	require.ErrorContains(t, err, "Delays[1]")
}

func TestOutcomeErrors(t *testing.T) {
	t.Parallel()
	cause := errors.New("invalid recipient")
	p := worker.Permanent(cause)
	require.True(t, worker.IsPermanent(p))
	require.True(t, worker.IsPermanent(fmt.Errorf("send: %w", p)))
	require.False(t, worker.IsPermanent(cause))
	require.ErrorIs(t, p, cause)
	require.Equal(t, "invalid recipient", p.Error())
	require.Equal(t, "permanent failure", worker.Permanent(nil).Error())

	ra := worker.RetryAfter(cause, 5*time.Minute)
	var rae *worker.RetryAfterError
	require.ErrorAs(t, fmt.Errorf("wrapped: %w", ra), &rae)
	require.Equal(t, 5*time.Minute, rae.Delay)
	require.ErrorIs(t, ra, cause)
	require.False(t, worker.IsPermanent(ra))
	require.Equal(t, "retry after 1s", worker.RetryAfter(nil, time.Second).Error())
}

func TestOutcomeString(t *testing.T) {
	t.Parallel()
	require.Equal(t, "ack", worker.OutcomeAck.String())
	require.Equal(t, "retry", worker.OutcomeRetry.String())
	require.Equal(t, "dead", worker.OutcomeDead.String())
	require.Equal(t, "duplicate", worker.OutcomeDuplicate.String())
}
