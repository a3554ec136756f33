package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferrymq/ferry/worker"
)

// The limits page reads at most this much of each table, so that a huge
// table cannot make it slow; the page and api/limits say when a list was
// cut.
const (
	// maxSlotRows is the most slots listed (held or with an expired
	// lease), in the table's primary-key order (limit, key, slot).
	maxSlotRows = 500
	// maxRateRows is the most rate-limit rows listed, in primary-key
	// order (limit, key).
	maxRateRows = 200
	// maxWaitRows is the most snoozed attempt records counted; past it the
	// waiters' counts are of the first maxWaitRows read.
	maxWaitRows = 10000
	// maxWaitConsumers is the most consumers whose waiters are listed
	// (most waiting first).
	maxWaitConsumers = 50
	// waitSamples is how many waiting messages are shown per consumer
	// (most snoozed first).
	waitSamples = 5
	// limitsTimeout bounds the reading when the request has no deadline.
	limitsTimeout = 5 * time.Second
)

// A released slot is expired in place (holder empty, expires_at -infinity;
// worker/flow.go): only rows with a holder are held or expired leases.
// The CASEs turn an infinite timestamp, which time.Time cannot hold, into
// NULL (shown as "-").
const (
	limitSlotsSQL = `SELECT limit_name, key, slot, holder,
	CASE WHEN isfinite(acquired_at) THEN acquired_at END,
	CASE WHEN isfinite(expires_at) THEN expires_at END,
	expires_at <= now()
FROM ` + worker.SlotsTable + ` WHERE holder <> '' ORDER BY limit_name, key, slot LIMIT $1`

	limitRatesSQL = `SELECT limit_name, key, CASE WHEN isfinite(tat) THEN tat END, tat > now()
FROM ` + worker.RatesTable + ` ORDER BY limit_name, key LIMIT $1`

	// limitWaitersSQL counts, per consumer, the messages snoozed and not
	// dead among the first $1 such records, and returns the $2 most
	// snoozed of each, consumers with the most waiting first, $3 rows at
	// most. A snooze writes no last_error (worker.recordSnoozeSQL): it is
	// the last failed attempt's. first_failed_at is when the record was
	// made: the first snooze, or the first failed attempt before it.
	limitWaitersSQL = `WITH w AS (
	SELECT consumer, message_id, attempts, snoozes, left(last_error, 1000) AS last_error, first_failed_at, updated_at
	FROM ` + worker.AttemptsTable + ` WHERE snoozes > 0 AND NOT dead LIMIT $1
), r AS (
	SELECT w.*, count(*) OVER (PARTITION BY consumer) AS waiting, sum(snoozes) OVER (PARTITION BY consumer) AS total,
		row_number() OVER (PARTITION BY consumer ORDER BY snoozes DESC, updated_at DESC, message_id) AS rn,
		count(*) OVER () AS seen
	FROM w
)
SELECT consumer, waiting, total, seen, message_id, attempts, snoozes, last_error, first_failed_at, updated_at
FROM r WHERE rn <= $2 ORDER BY waiting DESC, consumer, rn LIMIT $3`
)

// limitSlot is one concurrency slot with a holder: held, or its lease
// expired (the next delivery of its limit and key takes it over).
type limitSlot struct {
	Slot       int       `json:"slot"`
	Holder     string    `json:"holder"`
	AcquiredAt time.Time `json:"acquired_at"`
	ExpiresAt  time.Time `json:"expires_at"`
	Expired    bool      `json:"expired"`
	// HeldFor is how long ago it was acquired; Left how long its lease
	// runs on, Over how long ago it ran out (Expired).
	HeldFor, Left, Over time.Duration `json:"-"`
}

// slotGroup is the slots of one (limit, key).
type slotGroup struct {
	Limit   string      `json:"limit"`
	Key     string      `json:"key"`
	Held    int         `json:"held"`
	Expired int         `json:"expired"`
	Slots   []limitSlot `json:"slots"`
}

// rateState is one rate limit's GCRA state.
type rateState struct {
	Limit     string    `json:"limit"`
	Key       string    `json:"key"`
	TAT       time.Time `json:"tat"`
	Throttled bool      `json:"throttled"`
	// Ahead is how far tat is ahead of now (Throttled).
	Ahead time.Duration `json:"-"`
}

// waitSample is one waiting message of a consumer.
type waitSample struct {
	MessageID string    `json:"message_id"`
	Snoozes   int       `json:"snoozes"`
	Attempts  int       `json:"attempts"`
	LastError string    `json:"last_error"`
	Since     time.Time `json:"since"`
	UpdatedAt time.Time `json:"updated_at"`
}

// waiterGroup is the messages of one consumer waiting for a limit.
type waiterGroup struct {
	Consumer string       `json:"consumer"`
	Waiting  int64        `json:"waiting"`
	Snoozes  int64        `json:"snoozes"`
	Samples  []waitSample `json:"samples"`
}

// limitsData is the limits page's data, and api/limits' answer.
type limitsData struct {
	// Now is the database's clock, which expired and throttled are
	// judged by.
	Now                time.Time     `json:"now"`
	Slots              []slotGroup   `json:"slots"`
	SlotsTruncated     bool          `json:"slots_truncated"`
	Rates              []rateState   `json:"rates"`
	RatesTruncated     bool          `json:"rates_truncated"`
	Waiters            []waiterGroup `json:"waiters"`
	WaitersTruncated   bool          `json:"waiters_truncated"`
	ConsumersTruncated bool          `json:"consumers_truncated"`
	// The bounds, for the page's notes.
	MaxSlots      int `json:"-"`
	MaxRates      int `json:"-"`
	MaxWaits      int `json:"-"`
	MaxConsumers  int `json:"-"`
	SamplesShown  int `json:"-"`
	SlotsListed   int `json:"-"`
	ExpiredListed int `json:"-"`
}

// Empty reports whether no limit has any state: the page's empty state.
func (d *limitsData) Empty() bool {
	return len(d.Slots) == 0 && len(d.Rates) == 0 && len(d.Waiters) == 0
}

// readLimits reads the flow-control tables (worker.SlotsTable,
// worker.RatesTable, the snoozes of worker.AttemptsTable) in one read-only
// transaction, so that every row is judged by the same now().
func (c *Console) readLimits(ctx context.Context) (*limitsData, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, limitsTimeout)
		defer cancel()
	}
	d := &limitsData{Slots: []slotGroup{}, Rates: []rateState{}, Waiters: []waiterGroup{},
		MaxSlots: maxSlotRows, MaxRates: maxRateRows, MaxWaits: maxWaitRows, MaxConsumers: maxWaitConsumers, SamplesShown: waitSamples}
	err := pgx.BeginTxFunc(ctx, c.cfg.Pool, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&d.Now); err != nil {
			return err
		}
		if err := d.readSlots(ctx, tx); err != nil {
			return fmt.Errorf("%s: %w", worker.SlotsTable, err)
		}
		if err := d.readRates(ctx, tx); err != nil {
			return fmt.Errorf("%s: %w", worker.RatesTable, err)
		}
		if err := d.readWaiters(ctx, tx); err != nil {
			return fmt.Errorf("%s: %w", worker.AttemptsTable, err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("console: limits: %w", err)
	}
	return d, nil
}

func (d *limitsData) readSlots(ctx context.Context, tx pgx.Tx) error {
	rows, err := tx.Query(ctx, limitSlotsSQL, maxSlotRows+1)
	if err != nil {
		return err
	}
	defer rows.Close()
	n := 0
	var lastLimit, lastKey string
	for rows.Next() {
		if n++; n > maxSlotRows {
			d.SlotsTruncated = true
			break
		}
		var (
			limit, key string
			s          limitSlot
			acq, exp   *time.Time
		)
		if err := rows.Scan(&limit, &key, &s.Slot, &s.Holder, &acq, &exp, &s.Expired); err != nil {
			return err
		}
		if acq != nil {
			s.AcquiredAt, s.HeldFor = *acq, d.Now.Sub(*acq)
		}
		if exp != nil {
			s.ExpiresAt, s.Left, s.Over = *exp, exp.Sub(d.Now), d.Now.Sub(*exp)
		}
		s.Holder = text(s.Holder)
		if len(d.Slots) == 0 || limit != lastLimit || key != lastKey {
			d.Slots = append(d.Slots, slotGroup{Limit: text(limit), Key: text(key)})
			lastLimit, lastKey = limit, key
		}
		g := &d.Slots[len(d.Slots)-1]
		g.Slots = append(g.Slots, s)
		d.SlotsListed++
		if s.Expired {
			g.Expired++
			d.ExpiredListed++
		} else {
			g.Held++
		}
	}
	return rows.Err()
}

func (d *limitsData) readRates(ctx context.Context, tx pgx.Tx) error {
	rows, err := tx.Query(ctx, limitRatesSQL, maxRateRows+1)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if len(d.Rates) == maxRateRows {
			d.RatesTruncated = true
			break
		}
		var (
			r   rateState
			tat *time.Time
		)
		if err := rows.Scan(&r.Limit, &r.Key, &tat, &r.Throttled); err != nil {
			return err
		}
		if tat != nil {
			r.TAT, r.Ahead = *tat, tat.Sub(d.Now)
		}
		r.Limit, r.Key = text(r.Limit), text(r.Key)
		d.Rates = append(d.Rates, r)
	}
	return rows.Err()
}

func (d *limitsData) readWaiters(ctx context.Context, tx pgx.Tx) error {
	rows, err := tx.Query(ctx, limitWaitersSQL, maxWaitRows+1, waitSamples, (maxWaitConsumers+1)*waitSamples)
	if err != nil {
		return err
	}
	defer rows.Close()
	var last string
	for rows.Next() {
		var (
			consumer         string
			waiting, total   int64
			seen             int64
			s                waitSample
			since, updatedAt *time.Time
		)
		if err := rows.Scan(&consumer, &waiting, &total, &seen, &s.MessageID, &s.Attempts, &s.Snoozes, &s.LastError, &since, &updatedAt); err != nil {
			return err
		}
		d.WaitersTruncated = seen > maxWaitRows
		if len(d.Waiters) == 0 || consumer != last {
			if len(d.Waiters) == maxWaitConsumers {
				d.ConsumersTruncated = true
				break
			}
			d.Waiters = append(d.Waiters, waiterGroup{Consumer: text(consumer), Waiting: waiting, Snoozes: total})
			last = consumer
		}
		if since != nil {
			s.Since = *since
		}
		if updatedAt != nil {
			s.UpdatedAt = *updatedAt
		}
		s.MessageID, s.LastError = text(s.MessageID), text(s.LastError)
		g := &d.Waiters[len(d.Waiters)-1]
		g.Samples = append(g.Samples, s)
	}
	return rows.Err()
}

func (c *Console) limitsPage(w http.ResponseWriter, r *http.Request) {
	d, err := c.readLimits(r.Context())
	if err != nil {
		c.failErr(w, r, "reading the limits", err)
		return
	}
	c.render(w, r, http.StatusOK, "limits", "Limits", d)
}

// apiLimits is the limits page's data as JSON (docs/console.md, "Limits"):
//
//	{"now": T,
//	 "slots": [{"limit": S, "key": S, "held": N, "expired": N,
//	            "slots": [{"slot": N, "holder": S, "acquired_at": T, "expires_at": T, "expired": B}]}],
//	 "slots_truncated": B,
//	 "rates": [{"limit": S, "key": S, "tat": T, "throttled": B}],
//	 "rates_truncated": B,
//	 "waiters": [{"consumer": S, "waiting": N, "snoozes": N,
//	              "samples": [{"message_id": S, "snoozes": N, "attempts": N, "last_error": S, "since": T, "updated_at": T}]}],
//	 "waiters_truncated": B, "consumers_truncated": B}
//
// T is an RFC 3339 time; "now" is the database's clock, which "expired"
// (expires_at <= now) and "throttled" (tat > now) are judged by. The lists
// are never null; a *_truncated is true when its list was cut at the
// page's bound.
func (c *Console) apiLimits(w http.ResponseWriter, r *http.Request) {
	d, err := c.readLimits(r.Context())
	if err != nil {
		c.failErr(w, r, "reading the limits", err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(d)
}
