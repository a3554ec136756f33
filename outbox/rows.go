package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// RowState is the kind of unprocessed row ListRows lists.
type RowState string

// The kinds of unprocessed rows. Together they are every unprocessed row
// (Stats.Unprocessed plus Stats.Scheduled).
const (
	// RowPending: due, never failed (attempts = 0): the relay publishes
	// it at its next claim, or after a broker outage.
	RowPending RowState = "pending"
	// RowScheduled: enqueued with a DueAt still in the future
	// (Event.DueAt), never failed.
	RowScheduled RowState = "scheduled"
	// RowParked: its publication failed for a reason of its own at least
	// once (Stats.Parked); RetryParked and DropParked act on it.
	RowParked RowState = "parked"
)

// ErrRowNotFound is returned by GetRow for an id with no outbox row.
var ErrRowNotFound = errors.New("outbox: no such outbox row")

// MaxRowsLimit is the largest RowFilter.Limit.
const MaxRowsLimit = 500

// countCap is how many rows ListRows counts exactly; beyond it the total
// is the planner's estimate (RowPage.Estimated).
const countCap = 10000

// RowFilter selects the rows ListRows returns; zero fields select all.
type RowFilter struct {
	// State is the kind of row; it must be set.
	State RowState
	// Destination keeps the rows of this destination (Event.Destination).
	Destination string
	// Type keeps the rows of this event type; Key those of this
	// partition key; AppID those whose application id (Event.AppID) is
	// this.
	Type, Key, AppID string
	// ErrorContains keeps the rows whose last publication error contains
	// this text (case-insensitive); only parked rows have one.
	ErrorContains string
	// MinAge keeps the rows enqueued at least this long ago (by the
	// database clock).
	MinAge time.Duration
	// AfterID pages: only rows with a larger id (RowPage.Next of the
	// previous page); 0 starts at the oldest.
	AfterID int64
	// Limit is the page size; 0 means 50, at most MaxRowsLimit.
	Limit int
}

// Row is one outbox row.
type Row struct {
	// ID is the row id, the message ID as a decimal number.
	ID int64
	// Destination, Type, Key and AppID are the event's.
	Destination, Type, Key, AppID string
	// Payload is the event's body, Headers its headers.
	Payload []byte
	Headers map[string]string
	// Attempts is the number of failed publications, LastError the reason
	// of the last.
	Attempts  int
	LastError string
	// OccurredAt is when it was enqueued (its due time for a scheduled
	// row); NextAttemptAt when the relay tries it next (zero: at its next
	// claim); ProcessedAt when it was published (zero: not yet).
	OccurredAt, NextAttemptAt, ProcessedAt time.Time
}

// State is the row's kind, or "" for a published row.
func (r Row) State() RowState {
	switch {
	case !r.ProcessedAt.IsZero():
		return ""
	case r.Attempts > 0:
		return RowParked
	case !r.NextAttemptAt.IsZero() && r.NextAttemptAt.After(time.Now()):
		return RowScheduled
	}
	return RowPending
}

// RowPage is one page of ListRows.
type RowPage struct {
	// Rows are the page's rows, oldest (lowest id) first, without their
	// payloads (GetRow reads one whole).
	Rows []Row
	// Total is the number of rows the filter selects in all. It is exact
	// up to 10,000; beyond, it is the planner's estimate and Estimated
	// is true.
	Total     int64
	Estimated bool
	// Next is the RowFilter.AfterID of the next page; 0 on the last.
	Next int64
}

// rowsWhere returns the WHERE clause of f and its arguments. Each state
// matches a partial index: parked outbox_parked_idx, scheduled
// outbox_scheduled_idx, pending outbox_ready_dest_idx (rows without
// next_attempt_at); a pending row may also carry a passed next_attempt_at
// (a scheduled row now due), which the OR adds.
func rowsWhere(f RowFilter) (string, []any, error) {
	var conds []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	switch f.State {
	case RowParked:
		conds = append(conds, "processed_at IS NULL AND attempts > 0")
	case RowScheduled:
		conds = append(conds, "processed_at IS NULL AND attempts = 0 AND next_attempt_at IS NOT NULL AND next_attempt_at > now()")
	case RowPending:
		conds = append(conds, "processed_at IS NULL AND attempts = 0 AND (next_attempt_at IS NULL OR next_attempt_at <= now())")
	default:
		return "", nil, fmt.Errorf("%w: RowFilter.State %q: want pending, scheduled or parked", ErrInvalidConfig, f.State)
	}
	if f.Destination != "" {
		conds = append(conds, "destination = "+arg(f.Destination))
	}
	if f.Type != "" {
		conds = append(conds, "event_type = "+arg(f.Type))
	}
	if f.Key != "" {
		conds = append(conds, "partition_key = "+arg(f.Key))
	}
	if f.AppID != "" {
		// The ids first, from outbox_app_id_idx (an app id has few
		// rows), so the planner never walks the id order filtering on it.
		conds = append(conds, "id = ANY(ARRAY(SELECT id FROM outbox WHERE headers ? 'x-app-id' AND headers->>'x-app-id' = "+arg(f.AppID)+" LIMIT 10000))")
	}
	if f.ErrorContains != "" {
		conds = append(conds, "strpos(lower(COALESCE(last_error, '')), "+arg(strings.ToLower(f.ErrorContains))+") > 0")
	}
	if f.MinAge > 0 {
		conds = append(conds, "occurred_at <= now() - "+arg(f.MinAge.Milliseconds())+" * interval '1 millisecond'")
	}
	return strings.Join(conds, " AND "), args, nil
}

// ListRows returns one page of the unprocessed rows f selects, oldest
// first, with the total they count (exact up to 10,000, an estimate
// beyond, which RowPage.Estimated says). It only reads. An invalid f
// returns an error wrapping ErrInvalidConfig naming the field.
func ListRows(ctx context.Context, pool *pgxpool.Pool, f RowFilter) (RowPage, error) {
	if pool == nil {
		return RowPage{}, errors.New("outbox: list rows: pool is nil")
	}
	if f.Limit < 0 || f.Limit > MaxRowsLimit {
		return RowPage{}, fmt.Errorf("%w: RowFilter.Limit %d: want 0 (50) to %d", ErrInvalidConfig, f.Limit, MaxRowsLimit)
	}
	if f.MinAge < 0 || f.AfterID < 0 {
		return RowPage{}, fmt.Errorf("%w: RowFilter.MinAge and AfterID must not be negative", ErrInvalidConfig)
	}
	limit := f.Limit
	if limit == 0 {
		limit = 50
	}
	where, args, err := rowsWhere(f)
	if err != nil {
		return RowPage{}, err
	}
	wrap := func(err error) error {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return ctxErr
		}
		return fmt.Errorf("outbox: list rows: %w", err)
	}
	var page RowPage
	page.Total, page.Estimated, err = countCapped(ctx, pool, where, args)
	if err != nil {
		return RowPage{}, wrap(err)
	}
	n := len(args)
	largs := append(append([]any{}, args...), f.AfterID, limit+1)
	rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT id, destination, event_type, partition_key, COALESCE(headers->>'x-app-id', ''),
	attempts, COALESCE(last_error, ''), occurred_at, next_attempt_at
FROM outbox WHERE %s AND id > $%d ORDER BY id LIMIT $%d`, where, n+1, n+2), largs...)
	if err != nil {
		return RowPage{}, wrap(err)
	}
	page.Rows, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Row, error) {
		var r Row
		var next *time.Time
		err := row.Scan(&r.ID, &r.Destination, &r.Type, &r.Key, &r.AppID, &r.Attempts, &r.LastError, &r.OccurredAt, &next)
		if next != nil {
			r.NextAttemptAt = *next
		}
		return r, err
	})
	if err != nil {
		return RowPage{}, wrap(err)
	}
	if len(page.Rows) > limit {
		page.Rows = page.Rows[:limit]
		page.Next = page.Rows[limit-1].ID
	}
	return page, nil
}

// countCapped counts the outbox rows of where exactly up to countCap;
// beyond, it returns the planner's estimate and true.
func countCapped(ctx context.Context, pool *pgxpool.Pool, where string, args []any) (int64, bool, error) {
	var n int64
	cargs := append(append([]any{}, args...), countCap+1)
	if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM (SELECT 1 FROM outbox WHERE %s LIMIT $%d) s`, where, len(args)+1), cargs...).Scan(&n); err != nil {
		return 0, false, err
	}
	if n <= countCap {
		return n, false, nil
	}
	var plan []byte
	if err := pool.QueryRow(ctx, "EXPLAIN (FORMAT JSON) SELECT 1 FROM outbox WHERE "+where, args...).Scan(&plan); err != nil {
		return 0, false, err
	}
	var p []struct {
		Plan struct {
			Rows float64 `json:"Plan Rows"`
		} `json:"Plan"`
	}
	if err := json.Unmarshal(plan, &p); err == nil && len(p) == 1 {
		n = max(int64(p[0].Plan.Rows), countCap+1)
	}
	return n, true, nil
}

// Backlog is a Stats snapshot whose counts are capped, for a page that
// must answer quickly on any backlog: each of Unprocessed, Scheduled and
// Parked, per destination, is exact up to 10,000 and the planner's
// estimate beyond, which Estimated says. ReadStats counts exactly.
type Backlog struct {
	Stats
	// Estimated is true when any count is an estimate.
	Estimated bool
}

// ReadBacklog reads a Backlog from the database of pool: the
// destinations by a skip scan of outbox_unprocessed_dest_idx, each count
// capped (see Backlog), the oldest age (among the 1000 lowest unprocessed
// ids of each destination) and the processed counts as ReadStats reads
// them. It only reads.
func ReadBacklog(ctx context.Context, pool *pgxpool.Pool) (Backlog, error) {
	var b Backlog
	if pool == nil {
		return b, errors.New("outbox: backlog: pool is nil")
	}
	wrap := func(err error) error {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return ctxErr
		}
		return fmt.Errorf("outbox: backlog: %w", err)
	}
	// The processed counts as statsSQL reads them; the oldest age per
	// destination below, with the destination a parameter so the planner
	// walks that destination's rows (statsSQL's LATERAL may walk the
	// primary key through every row of a large backlog).
	if err := pool.QueryRow(ctx, `SELECT
	(SELECT count(*) FROM outbox WHERE processed_at IS NOT NULL AND processed_at > now() - interval '1 minute'),
	(SELECT count(*) FROM outbox WHERE processed_at IS NOT NULL AND processed_at > now() - interval '1 hour')`).Scan(&b.ProcessedLastMinute, &b.ProcessedLastHour); err != nil {
		return Backlog{}, wrap(err)
	}
	rows, err := pool.Query(ctx, `WITH RECURSIVE dests(dest) AS (
	SELECT min(destination) FROM outbox WHERE processed_at IS NULL
	UNION ALL
	SELECT (SELECT min(destination) FROM outbox WHERE processed_at IS NULL AND destination > d.dest)
	FROM dests d WHERE d.dest IS NOT NULL
) SELECT dest FROM dests WHERE dest IS NOT NULL ORDER BY dest`)
	if err != nil {
		return Backlog{}, wrap(err)
	}
	dests, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return Backlog{}, wrap(err)
	}
	// The same partitions as destinationsSQL's.
	parts := []string{
		"processed_at IS NULL AND destination = $1 AND occurred_at <= now()",
		// Scheduled as destinationsSQL says (occurred_at > now()): the
		// same rows, as enqueueSQL sets both to the due time.
		"processed_at IS NULL AND destination = $1 AND attempts = 0 AND next_attempt_at IS NOT NULL AND next_attempt_at > now() AND occurred_at > now()",
		"processed_at IS NULL AND destination = $1 AND attempts > 0",
	}
	for _, d := range dests {
		var ageMS int64
		if err := pool.QueryRow(ctx, `SELECT COALESCE(EXTRACT(EPOCH FROM now() - min(occurred_at)) * 1000, 0)::bigint
FROM (SELECT occurred_at FROM outbox WHERE processed_at IS NULL AND destination = $1 AND occurred_at <= now() ORDER BY id LIMIT 1000) s`, d).Scan(&ageMS); err != nil {
			return Backlog{}, wrap(err)
		}
		b.OldestUnprocessedAge = max(b.OldestUnprocessedAge, time.Duration(ageMS)*time.Millisecond)
		ds := DestinationStats{Destination: d}
		for i, where := range parts {
			n, est, err := countCapped(ctx, pool, where, []any{d})
			if err != nil {
				return Backlog{}, wrap(err)
			}
			b.Estimated = b.Estimated || est
			*[]*int64{&ds.Unprocessed, &ds.Scheduled, &ds.Parked}[i] = n
		}
		b.Destinations = append(b.Destinations, ds)
		b.Unprocessed += ds.Unprocessed
		b.Scheduled += ds.Scheduled
		b.Parked += ds.Parked
	}
	return b, nil
}

// GetRow returns the outbox row id whole (payload and headers), published
// or not. It returns an error wrapping ErrRowNotFound when there is no
// such row (never enqueued, cancelled, dropped, or deleted by retention).
func GetRow(ctx context.Context, pool *pgxpool.Pool, id int64) (Row, error) {
	if pool == nil {
		return Row{}, errors.New("outbox: get row: pool is nil")
	}
	var (
		r               Row
		next, processed *time.Time
		headers         []byte
	)
	err := pool.QueryRow(ctx, `SELECT id, destination, event_type, partition_key, payload, headers, attempts, COALESCE(last_error, ''),
	occurred_at, next_attempt_at, processed_at FROM outbox WHERE id = $1`, id).
		Scan(&r.ID, &r.Destination, &r.Type, &r.Key, &r.Payload, &headers, &r.Attempts, &r.LastError, &r.OccurredAt, &next, &processed)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Row{}, fmt.Errorf("%w: id %d", ErrRowNotFound, id)
	case err != nil:
		if ctxErr := ctx.Err(); ctxErr != nil {
			return Row{}, ctxErr
		}
		return Row{}, fmt.Errorf("outbox: get row %d: %w", id, err)
	}
	r.NextAttemptAt, r.ProcessedAt = deref(next), deref(processed)
	var raw map[string]any
	if err := json.Unmarshal(headers, &raw); err == nil {
		r.Headers = make(map[string]string, len(raw))
		for k, v := range raw {
			if s, ok := v.(string); ok {
				r.Headers[k] = s
			} else {
				b, _ := json.Marshal(v)
				r.Headers[k] = string(b)
			}
		}
	}
	r.AppID = r.Headers["x-app-id"]
	return r, nil
}

// RatePoint is one minute of Rates.
type RatePoint struct {
	// Minute is the start of the minute (database clock, UTC).
	Minute time.Time
	// Published is the number of outbox rows the relay marked published
	// in that minute; Handled the number of messages the workers' handlers
	// committed (processed_messages, all consumers); Dead the number the
	// workers dead-lettered (worker_dead).
	Published, Handled, Dead int64
}

// Rates returns, for each of the last minutes minutes (1 to 120, oldest
// first, the current minute last), how many rows were published and how
// many messages handled and dead-lettered. It reads the processed_at and
// dead_at indexes only. minutes out of range returns an error wrapping
// ErrInvalidConfig.
func Rates(ctx context.Context, pool *pgxpool.Pool, minutes int) ([]RatePoint, error) {
	if pool == nil {
		return nil, errors.New("outbox: rates: pool is nil")
	}
	if minutes < 1 || minutes > 120 {
		return nil, fmt.Errorf("%w: rates: minutes %d: want 1 to 120", ErrInvalidConfig, minutes)
	}
	rows, err := pool.Query(ctx, `WITH m AS (
  SELECT generate_series(date_trunc('minute', now()) - ($1 - 1) * interval '1 minute', date_trunc('minute', now()), interval '1 minute') AS minute
), p AS (
  SELECT date_trunc('minute', processed_at) AS minute, count(*) AS n FROM outbox
  WHERE processed_at IS NOT NULL AND processed_at >= date_trunc('minute', now()) - ($1 - 1) * interval '1 minute' GROUP BY 1
), h AS (
  SELECT date_trunc('minute', processed_at) AS minute, count(*) AS n FROM processed_messages
  WHERE processed_at >= date_trunc('minute', now()) - ($1 - 1) * interval '1 minute' GROUP BY 1
), d AS (
  SELECT date_trunc('minute', dead_at) AS minute, count(*) AS n FROM worker_dead
  WHERE dead_at >= date_trunc('minute', now()) - ($1 - 1) * interval '1 minute' GROUP BY 1
)
SELECT m.minute, COALESCE(p.n, 0), COALESCE(h.n, 0), COALESCE(d.n, 0)
FROM m LEFT JOIN p USING (minute) LEFT JOIN h USING (minute) LEFT JOIN d USING (minute) ORDER BY m.minute`, minutes)
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, ctxErr
		}
		return nil, fmt.Errorf("outbox: rates: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (RatePoint, error) {
		var p RatePoint
		err := row.Scan(&p.Minute, &p.Published, &p.Handled, &p.Dead)
		return p, err
	})
}
