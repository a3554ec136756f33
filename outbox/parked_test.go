package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/outbox"
)

// A parked row can be retried now or dropped by an operator; other rows
// are refused with ErrNotParked. processed_at records the broker's
// confirm, not the claim (issue 7, item 7).
func TestParkedRetryDropAndConfirmTime(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rg := setup(t)
	bad := enqueue(t, rg.pool, outbox.Event{Type: "unbound.event", Body: []byte("x")}, outbox.Event{Type: "unbound.other", Body: []byte("y")})
	good := enqueue(t, rg.pool, events(1, "test.good")...)
	r := newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: slowBroker{rg.b}, RetryBackoff: time.Hour, MaxRetryBackoff: time.Hour})
	var before time.Time
	require.NoError(t, rg.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&before))
	_, err := r.ProcessBatch(ctx)
	require.Error(t, err)
	var processed time.Time
	require.NoError(t, rg.pool.QueryRow(ctx, `SELECT processed_at FROM outbox WHERE id = $1`, good[0]).Scan(&processed))
	// Publish took 300 ms after the claim: processed_at is when it
	// returned (the confirm), not the claim transaction's start.
	require.True(t, processed.After(before.Add(250*time.Millisecond)), "processed_at %v, batch began at %v", processed, before)
	require.True(t, processed.Before(before.Add(5*time.Second)), "processed_at %v, batch began at %v", processed, before)

	_, err = outbox.RetryParked(ctx, rg.pool, good[0])
	require.ErrorIs(t, err, outbox.ErrNotParked)
	_, err = outbox.DropParked(ctx, rg.pool, 999999)
	require.ErrorIs(t, err, outbox.ErrNotParked)

	p, err := outbox.RetryParked(ctx, rg.pool, bad[0])
	require.NoError(t, err)
	require.Equal(t, "unbound.event", p.Type)
	require.Equal(t, 1, p.Attempts)
	var due bool
	require.NoError(t, rg.pool.QueryRow(ctx, `SELECT next_attempt_at IS NULL FROM outbox WHERE id = $1`, bad[0]).Scan(&due))
	require.True(t, due)
	_, err = r.ProcessBatch(ctx) // retried at once, fails again, parked again
	require.Error(t, err)
	st, err := outbox.ReadStats(ctx, rg.pool)
	require.NoError(t, err)
	require.EqualValues(t, 2, st.Parked)
	require.Equal(t, 2, st.ParkedRows[0].Attempts)

	p, err = outbox.DropParked(ctx, rg.pool, bad[1])
	require.NoError(t, err)
	require.Equal(t, "unbound.other", p.Type)
	require.Contains(t, p.LastError, "unroutable")
	st, err = outbox.ReadStats(ctx, rg.pool)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Parked)
	require.EqualValues(t, 1, st.Unprocessed)
}

// slowBroker takes 300 ms more for every Publish.
type slowBroker struct{ broker.Broker }

func (b slowBroker) Publish(ctx context.Context, msgs []*broker.Message) error {
	time.Sleep(300 * time.Millisecond)
	return b.Broker.Publish(ctx, msgs)
}
