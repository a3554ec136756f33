package metrics_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/metrics"
	"github.com/ferrymq/ferry/outbox"
)

// TestOutboxGaugesFromPostgres scrapes the outbox gauges backed by
// outbox.ReadStats on a real PostgreSQL database.
func TestOutboxGaugesFromPostgres(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testenv.NewPool(t)
	require.NoError(t, outbox.Migrate(ctx, pool))
	b := setup(t)
	require.NoError(t, metrics.RegisterOutbox(b.reg, "rabbitmq", func(ctx context.Context) (int, time.Duration, error) {
		s, err := outbox.ReadStats(ctx, pool)
		return int(s.Unprocessed), s.OldestUnprocessedAge, err
	}))

	fams := scrape(t, b.srv)
	require.Equal(t, 0.0, one(t, fams, metrics.OutboxUnprocessedRows, "").GetGauge().GetValue())
	require.Equal(t, 0.0, one(t, fams, metrics.OutboxOldestAgeSeconds, "").GetGauge().GetValue())

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = outbox.Enqueue(ctx, tx,
		outbox.Event{Type: "notification.requested", Body: []byte(`{}`)},
		outbox.Event{Type: "notification.requested", Body: []byte(`{}`)},
		outbox.Event{Type: "notification.requested", Body: []byte(`{}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	_, err = pool.Exec(ctx, `UPDATE outbox SET occurred_at = now() - interval '10 minutes' WHERE id = (SELECT min(id) FROM outbox)`)
	require.NoError(t, err)

	fams = scrape(t, b.srv)
	require.Equal(t, 3.0, one(t, fams, metrics.OutboxUnprocessedRows, "").GetGauge().GetValue())
	require.InDelta(t, 600.0, one(t, fams, metrics.OutboxOldestAgeSeconds, "").GetGauge().GetValue(), 30)

	_, err = pool.Exec(ctx, `UPDATE outbox SET processed_at = now()`)
	require.NoError(t, err)
	fams = scrape(t, b.srv)
	require.Equal(t, 0.0, one(t, fams, metrics.OutboxUnprocessedRows, "").GetGauge().GetValue())
}

// TestOutboxParkedGauge: ferry_outbox_parked_rows counts the rows whose
// publication failed for a reason of their own.
func TestOutboxParkedGauge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testenv.NewPool(t)
	require.NoError(t, outbox.Migrate(ctx, pool))
	b := setup(t)
	require.NoError(t, metrics.RegisterOutboxStats(b.reg, "rabbitmq", func(ctx context.Context) (metrics.OutboxStats, error) {
		s, err := outbox.ReadStats(ctx, pool)
		return metrics.OutboxStats{Unprocessed: int(s.Unprocessed), Oldest: s.OldestUnprocessedAge, Parked: int(s.Parked)}, err
	}))
	require.Equal(t, 0.0, one(t, scrape(t, b.srv), metrics.OutboxParkedRows, "").GetGauge().GetValue())
	_, err := pool.Exec(ctx, `INSERT INTO outbox (event_type, payload, attempts, last_error, next_attempt_at)
		VALUES ('a.b', 'x', 3, 'unroutable', now() + interval '1 hour'), ('a.b', 'x', 1, 'too large', now() + interval '1 hour'), ('a.b', 'x', 0, NULL, NULL)`)
	require.NoError(t, err)
	fams := scrape(t, b.srv)
	require.Equal(t, 2.0, one(t, fams, metrics.OutboxParkedRows, "").GetGauge().GetValue())
	require.Equal(t, 3.0, one(t, fams, metrics.OutboxUnprocessedRows, "").GetGauge().GetValue())
}
