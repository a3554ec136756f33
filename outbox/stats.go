package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// MaxParkedRows is the number of parked rows Stats.ParkedRows lists.
const MaxParkedRows = 20

// Stats is a snapshot of the outbox, for `ferry outbox stats`, metrics and
// the backlog alert.
type Stats struct {
	// Unprocessed is the number of rows due and not yet published (parked
	// rows included; scheduled rows not yet due are in Scheduled instead).
	Unprocessed int64
	// OldestUnprocessedAge is how long ago the oldest unprocessed row was
	// enqueued, or became due for a scheduled row (by the database clock;
	// the oldest among the 1000 lowest unprocessed ids of each
	// destination); 0 when there is none.
	OldestUnprocessedAge time.Duration
	// Scheduled is the number of rows enqueued with a DueAt still in the
	// future (Event.DueAt): they wait as planned, and are neither backlog
	// nor parked.
	Scheduled int64
	// ProcessedLastMinute is the number of rows marked processed in the
	// last minute.
	ProcessedLastMinute int64
	// ProcessedLastHour is the number of rows marked processed in the
	// last hour.
	ProcessedLastHour int64
	// Parked is the number of unprocessed rows whose publication failed
	// for a reason of their own at least once (attempts > 0; see
	// broker.IsMessageFault). Rows that only waited out a broker outage
	// are not parked: an outage counts no attempts.
	Parked int64
	// ParkedRows lists up to MaxParkedRows parked rows, oldest first.
	ParkedRows []ParkedRow
	// Destinations splits Unprocessed, Scheduled and Parked by
	// destination (Event.Destination), one entry per destination with
	// unprocessed rows, in name order; empty when there are none. A
	// destination whose backlog grows while the others drain has no
	// relay running (RelayConfig.Destination).
	Destinations []DestinationStats
}

// DestinationStats is the part of a Stats snapshot of one destination.
type DestinationStats struct {
	// Destination is the destination's name.
	Destination string
	// Unprocessed, Scheduled and Parked are as in Stats, for the rows of
	// this destination.
	Unprocessed, Scheduled, Parked int64
}

// ParkedRow is an unprocessed row whose publication failed for a reason
// of its own; RetryParked and DropParked act on one.
type ParkedRow struct {
	// ID is the row id (the message ID as a decimal number).
	ID int64
	// Destination is the outbox the row belongs to (Event.Destination):
	// only a relay of that destination publishes it, so a row parked as
	// unroutable is a problem of that destination's topology.
	Destination string
	// Type is the event type.
	Type string
	// Attempts is the number of failed publications.
	Attempts int
	// LastError is the reason of the last failure.
	LastError string
	// OccurredAt is when the row was enqueued.
	OccurredAt time.Time
	// NextAttemptAt is when the relay will try it again; zero means at the
	// next batch.
	NextAttemptAt time.Time
}

// statsSQL: a scheduled row not yet due has occurred_at (its DueAt) in
// the future (enqueueSQL). dests lists the destinations with unprocessed
// rows by skipping through outbox_unprocessed_dest_idx (one probe per
// destination), and the oldest age looks at the 1000 lowest ids of each.
const statsSQL = `WITH RECURSIVE dests(dest) AS (
	SELECT min(destination) FROM outbox WHERE processed_at IS NULL
	UNION ALL
	SELECT (SELECT min(destination) FROM outbox WHERE processed_at IS NULL AND destination > d.dest)
	FROM dests d WHERE d.dest IS NOT NULL
)
SELECT
	(SELECT COALESCE(EXTRACT(EPOCH FROM now() - min(o.occurred_at)) * 1000, 0)::bigint
	   FROM dests d, LATERAL (SELECT occurred_at FROM outbox WHERE processed_at IS NULL AND destination = d.dest
	                           AND occurred_at <= now() ORDER BY id LIMIT 1000) o),
	(SELECT count(*) FROM outbox WHERE processed_at IS NOT NULL AND processed_at > now() - interval '1 minute'),
	(SELECT count(*) FROM outbox WHERE processed_at IS NOT NULL AND processed_at > now() - interval '1 hour')`

// destinationsSQL counts the unprocessed rows per destination; Stats'
// totals are their sums.
const destinationsSQL = `SELECT destination,
	count(*) FILTER (WHERE occurred_at <= now()),
	count(*) FILTER (WHERE occurred_at > now() AND attempts = 0),
	count(*) FILTER (WHERE attempts > 0)
FROM outbox WHERE processed_at IS NULL
GROUP BY destination ORDER BY destination`

const parkedSQL = `SELECT id, destination, event_type, attempts, COALESCE(last_error, ''), occurred_at, next_attempt_at
FROM outbox WHERE processed_at IS NULL AND attempts > 0 ORDER BY id LIMIT $1`

// ReadStats reads a Stats snapshot from the database of pool. It only
// reads (index scans on the partial indexes), so it is cheap enough for a
// metrics scrape.
func ReadStats(ctx context.Context, pool *pgxpool.Pool) (Stats, error) {
	var s Stats
	if pool == nil {
		return s, errors.New("outbox: stats: pool is nil")
	}
	wrap := func(err error) error {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return ctxErr
		}
		return fmt.Errorf("outbox: stats: %w", err)
	}
	var ageMS int64
	if err := pool.QueryRow(ctx, statsSQL).Scan(&ageMS, &s.ProcessedLastMinute, &s.ProcessedLastHour); err != nil {
		return Stats{}, wrap(err)
	}
	drows, err := pool.Query(ctx, destinationsSQL)
	if err != nil {
		return Stats{}, wrap(err)
	}
	s.Destinations, err = pgx.CollectRows(drows, func(row pgx.CollectableRow) (DestinationStats, error) {
		var d DestinationStats
		err := row.Scan(&d.Destination, &d.Unprocessed, &d.Scheduled, &d.Parked)
		return d, err
	})
	if err != nil {
		return Stats{}, wrap(err)
	}
	if len(s.Destinations) == 0 {
		s.Destinations = nil
	}
	for _, d := range s.Destinations {
		s.Unprocessed += d.Unprocessed
		s.Scheduled += d.Scheduled
		s.Parked += d.Parked
	}
	s.OldestUnprocessedAge = max(time.Duration(ageMS)*time.Millisecond, 0)
	if s.Parked == 0 {
		return s, nil
	}
	rows, err := pool.Query(ctx, parkedSQL, MaxParkedRows)
	if err != nil {
		return Stats{}, wrap(err)
	}
	s.ParkedRows, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (ParkedRow, error) {
		var p ParkedRow
		var next *time.Time
		err := row.Scan(&p.ID, &p.Destination, &p.Type, &p.Attempts, &p.LastError, &p.OccurredAt, &next)
		if next != nil {
			p.NextAttemptAt = *next
		}
		return p, err
	})
	if err != nil {
		return Stats{}, wrap(err)
	}
	return s, nil
}

// runningRelaysSQL counts the polling relays' LISTEN sessions and the
// WAL relays' streaming slots on the current database.
const runningRelaysSQL = `SELECT
  (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query = 'LISTEN ' || $1::text),
  (SELECT count(*) FROM pg_replication_slots s JOIN outbox_wal_slots w USING (slot_name) WHERE s.active AND s.database = current_database())`

// RunningRelays returns how many relays publish from pool's database now:
// polling relays by their session LISTENing on NotifyChannel (its last
// statement in pg_stat_activity: one per relay), WAL relays by their
// registered slot being streamed (pg_replication_slots.active). A role
// that may not see other roles' sessions (pg_read_all_stats) counts only
// the polling relays of its own role. Errors are the database's, wrapped.
func RunningRelays(ctx context.Context, pool *pgxpool.Pool) (poll, wal int, err error) {
	if err := pool.QueryRow(ctx, runningRelaysSQL, NotifyChannel).Scan(&poll, &wal); err != nil {
		return 0, 0, fmt.Errorf("outbox: running relays: %w", err)
	}
	return poll, wal, nil
}
