package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ferrymq/ferry/broker"
)

// NotifyChannel is the PostgreSQL LISTEN/NOTIFY channel Enqueue notifies in
// the caller's transaction; the relay listens on it. PostgreSQL delivers the
// notification only when the transaction commits, and folds identical
// notifications of one transaction into one.
const NotifyChannel = "ferry_outbox"

// MaxTypeBytes bounds Event.Type (bytes): the AMQP 0-9-1 routing key is a
// short string of at most 255 bytes.
const MaxTypeBytes = 255

// MaxHeaderNameBytes bounds the name of an Event header (bytes): an AMQP
// 0-9-1 field-table name is a short string of at most 128 bytes (AMQP
// 0-9-1 specification, "field-name").
const MaxHeaderNameBytes = 128

// Event is one event to publish through the outbox.
type Event struct {
	// Type is the event type and routing key, e.g. "notification.requested":
	// non-empty dot-separated words without '*', '#' or '>' (wildcards of
	// AMQP and NATS), spaces or control characters, at most MaxTypeBytes
	// bytes of valid UTF-8. Required.
	Type string
	// Key is the ordering (partition) key, e.g. a user id; see
	// broker.Message.Key. The relay publishes the rows of one Key in id
	// order (see the package documentation, "Order"). Valid UTF-8 without
	// NUL, CR or LF. Optional.
	Key string
	// Body is the payload, opaque bytes. Required (non-nil; it may be empty).
	Body []byte
	// Headers are carried with the message, e.g. broker.HeaderTraceparent.
	// A name is 1..MaxHeaderNameBytes bytes of printable ASCII without
	// spaces or ':' (a NATS header name; an AMQP field name) and must not
	// start with "x-" (ferry's own headers), "ferry-" or "nats-"
	// (reserved by the adapters); a value is valid UTF-8 without NUL, CR
	// or LF. These are the rules every ferry broker can carry, so an
	// outbox can be relayed to any of them; sizes are checked by the
	// broker (its Capabilities), and an oversized row is parked by the
	// relay. May be nil.
	Headers map[string]string
	// AppID is the application's own id of what the event is about (e.g.
	// the notification id), carried as the header broker.HeaderAppID so
	// an operator finds the message by the id the application's API uses
	// ("ferry dlq list" shows it and filters on it with --app-id).
	// Optional; at most MaxAppIDBytes bytes of valid UTF-8 without control
	// characters.
	AppID string
	// DueAt, when not zero, schedules the event: the relay publishes it no
	// earlier than DueAt, compared with the database server's clock (it
	// is stored as the row's next_attempt_at). The relay finds a row that
	// became due on its next poll, so it is published within
	// RelayConfig.PollInterval (500 ms by default) after DueAt while the
	// relay and the broker are up. Its row's occurred_at (and so the
	// message's broker.HeaderCreatedAt) is DueAt when that is later than
	// the transaction's start, and it is counted in Stats.Scheduled, not in
	// the backlog, until due. Zero, or a time already past, publishes at
	// once. Optional.
	DueAt time.Time
	// Destination names the outbox the event belongs to: only a relay
	// whose RelayConfig.Destination is the same claims and publishes it
	// (see the package documentation, "Destinations"), e.g. the service's
	// name or the exchange its relay publishes to. At most
	// MaxDestinationBytes bytes of printable ASCII without spaces.
	// Defaults to DefaultDestination ("default").
	Destination string
	// UniqueKey, when not empty, makes the event unique for UniqueFor: an
	// Enqueue of an event with the same UniqueKey less than UniqueFor
	// after this one (by the database clock, from the start of this
	// event's transaction) inserts nothing and returns this event's id
	// (see the package documentation, "Unique events"). The key is
	// database-wide, across types and destinations: include the type in
	// it when two types could share one, e.g. "email.welcome:user-42".
	// At most MaxUniqueKeyBytes bytes of valid UTF-8. Optional.
	UniqueKey string
	// Priority is the event's priority, 0 (the default, lowest) to
	// broker.MaxPriority (4), carried as the header broker.HeaderPriority:
	// the relay publishes it to the level of each priority queue
	// (broker.Queue.Priorities) that its priority selects, and a worker of
	// that queue takes the higher levels first (broker.Prioritized). A
	// priority above 0 needs a topology with at least one queue with
	// priorities: without one no queue is bound to the prioritised Type
	// and the relay parks the row as unroutable (ErrUnroutable).
	Priority int
	// UniqueFor is the window of UniqueKey, at least a microsecond (the
	// database's resolution). Required with UniqueKey, and must be zero
	// without it.
	UniqueFor time.Duration
}

// MaxAppIDBytes bounds Event.AppID (bytes).
const MaxAppIDBytes = 255

// DefaultDestination is the destination of an Event that names none, and
// the one a relay without RelayConfig.Destination claims. Migration 5
// gave it to the rows enqueued before destinations existed.
const DefaultDestination = "default"

// MaxDestinationBytes bounds Event.Destination and
// RelayConfig.Destination (bytes).
const MaxDestinationBytes = 255

// MaxUniqueKeyBytes bounds Event.UniqueKey (bytes).
const MaxUniqueKeyBytes = 1000

// ValidateDestination reports what is wrong with the destination name d
// ("" stands for DefaultDestination and is valid), or nil: at most
// MaxDestinationBytes bytes of printable ASCII without spaces.
func ValidateDestination(d string) error {
	if len(d) > MaxDestinationBytes {
		return fmt.Errorf("is %d bytes, at most %d", len(d), MaxDestinationBytes)
	}
	if strings.ContainsFunc(d, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
		return errors.New("must be printable ASCII without spaces")
	}
	return nil
}

// Validate reports the first problem with e, naming the field, or nil.
// The error wraps ErrInvalidEvent.
func (e Event) Validate() error { return e.validate(-1) }

func (e Event) validate(i int) error {
	field := func(name string) string {
		if i < 0 {
			return name
		}
		return fmt.Sprintf("events[%d].%s", i, name)
	}
	if err := validateType(e.Type); err != nil {
		return fmt.Errorf("%w: %s %q: %s", ErrInvalidEvent, field("Type"), e.Type, err)
	}
	if !utf8.ValidString(e.Key) || strings.ContainsAny(e.Key, "\x00\r\n") {
		return fmt.Errorf("%w: %s %q: must be valid UTF-8 without NUL, CR or LF", ErrInvalidEvent, field("Key"), e.Key)
	}
	if e.Body == nil {
		return fmt.Errorf("%w: %s: is nil (use []byte{} for an empty body)", ErrInvalidEvent, field("Body"))
	}
	if len(e.AppID) > MaxAppIDBytes || !utf8.ValidString(e.AppID) ||
		strings.ContainsFunc(e.AppID, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return fmt.Errorf("%w: %s %q: want at most %d bytes of valid UTF-8 without control characters", ErrInvalidEvent, field("AppID"), clipID(e.AppID), MaxAppIDBytes)
	}
	if e.Priority < 0 || e.Priority > broker.MaxPriority {
		return fmt.Errorf("%w: %s %d: want 0..%d", ErrInvalidEvent, field("Priority"), e.Priority, broker.MaxPriority)
	}
	if err := ValidateDestination(e.Destination); err != nil {
		return fmt.Errorf("%w: %s %q: %s", ErrInvalidEvent, field("Destination"), clipID(e.Destination), err)
	}
	switch {
	case len(e.UniqueKey) > MaxUniqueKeyBytes || !utf8.ValidString(e.UniqueKey):
		return fmt.Errorf("%w: %s %q: want at most %d bytes of valid UTF-8", ErrInvalidEvent, field("UniqueKey"), clipID(e.UniqueKey), MaxUniqueKeyBytes)
	case e.UniqueKey != "" && e.UniqueFor < time.Microsecond:
		return fmt.Errorf("%w: %s %v: want at least 1µs with a UniqueKey", ErrInvalidEvent, field("UniqueFor"), e.UniqueFor)
	case e.UniqueKey == "" && e.UniqueFor != 0:
		return fmt.Errorf("%w: %s %v: set without a UniqueKey", ErrInvalidEvent, field("UniqueFor"), e.UniqueFor)
	}
	for k, v := range e.Headers {
		if err := validateHeader(k, v); err != nil {
			return fmt.Errorf("%w: %s[%q]: %s", ErrInvalidEvent, field("Headers"), k, err)
		}
	}
	return nil
}

// clipID shortens an invalid AppID for an error message.
func clipID(s string) string {
	if len(s) <= 64 {
		return s
	}
	return strings.ToValidUTF8(s[:64], "") + "..."
}

func validateHeader(k, v string) error {
	lower := strings.ToLower(k)
	switch {
	case k == "":
		return errors.New("empty name")
	case len(k) > MaxHeaderNameBytes:
		return fmt.Errorf("name is %d bytes, at most %d", len(k), MaxHeaderNameBytes)
	case strings.HasPrefix(lower, "x-"):
		return errors.New(`names starting with "x-" are reserved for ferry`)
	case strings.HasPrefix(lower, "ferry-"), strings.HasPrefix(lower, "nats-"):
		return errors.New(`names starting with "ferry-" or "nats-" are reserved by the broker adapters`)
	case strings.ContainsFunc(k, func(r rune) bool { return r <= ' ' || r >= 0x7f || r == ':' }):
		return errors.New("name must be printable ASCII without spaces or ':'")
	case !utf8.ValidString(v) || strings.ContainsAny(v, "\x00\r\n"):
		return errors.New("value must be valid UTF-8 without NUL, CR or LF")
	}
	return nil
}

func validateType(t string) error {
	if t == "" {
		return errors.New("is empty")
	}
	if len(t) > MaxTypeBytes {
		return fmt.Errorf("is %d bytes, at most %d allowed", len(t), MaxTypeBytes)
	}
	if !utf8.ValidString(t) {
		return errors.New("is not valid UTF-8")
	}
	if strings.HasPrefix(t, broker.PriorityPrefix) {
		return fmt.Errorf("must not start with %q (reserved for priorities, broker.PriorityType)", broker.PriorityPrefix)
	}
	for _, w := range strings.Split(t, ".") {
		if w == "" {
			return errors.New("must be dot-separated non-empty words")
		}
		if strings.ContainsAny(w, "*#>") {
			return errors.New("must not contain '*', '#' or '>' (a routing key, not a pattern)")
		}
		if strings.ContainsFunc(w, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			return errors.New("must not contain spaces or control characters")
		}
	}
	return nil
}

// enqueueSQL sets a scheduled row's next_attempt_at, which the relay's
// claim honours, and its occurred_at to the due time when that is later
// than now(): the event "occurs" when it is due, so the backlog statistics,
// the stuck-outbox alert and the end-to-end latency (broker.HeaderCreatedAt)
// start counting then, not while it waits as planned.
const enqueueSQL = `INSERT INTO outbox (event_type, partition_key, payload, headers, next_attempt_at, occurred_at, destination)
SELECT t, k, p, h, d, GREATEST(now(), d), dst
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::jsonb[], $5::timestamptz[], $6::text[]) WITH ORDINALITY AS e(t, k, p, h, d, dst, ord)
ORDER BY ord
RETURNING id`

// uniqueSQL enqueues one unique event (Event.UniqueKey $1, UniqueFor $2
// microseconds): it takes the next outbox id and upserts the key's
// outbox_unique row. A new key, or one whose window has passed, gets the
// new id and a new window, and the event row is inserted under that id; a
// key still inside its window keeps its row, so nothing is inserted, and
// the statement returns the id of the key's event either way. A concurrent
// transaction holding an uncommitted row of the key makes the INSERT wait
// for it (the primary key), then act on its committed row or, when it
// rolled back, insert. The DO UPDATE always writes (to the same values
// inside the window) so that RETURNING gives the row's current event_id.
const uniqueSQL = `WITH n AS (SELECT nextval('outbox_id_seq') AS id),
u AS (
  INSERT INTO outbox_unique AS o (unique_key, event_id, expires_at)
  SELECT $1, n.id, now() + $2::bigint * interval '1 microsecond' FROM n
  ON CONFLICT (unique_key) DO UPDATE
    SET event_id = CASE WHEN o.expires_at <= now() THEN EXCLUDED.event_id ELSE o.event_id END,
        expires_at = CASE WHEN o.expires_at <= now() THEN EXCLUDED.expires_at ELSE o.expires_at END
  RETURNING o.event_id
),
i AS (
  INSERT INTO outbox (id, event_type, partition_key, payload, headers, next_attempt_at, occurred_at, destination)
  SELECT u.event_id, $3::text, $4::text, $5::bytea, $6::jsonb, $7::timestamptz, GREATEST(now(), $7::timestamptz), $8::text
  FROM u JOIN n ON u.event_id = n.id
  RETURNING id
)
SELECT event_id FROM u`

// enqueueArgs are the values the statements insert, one element per event.
type enqueueArgs struct {
	types, keys, headers, dests []string
	bodies                      [][]byte
	due                         []pgtype.Timestamptz
	events                      []Event
	// allLater is true when every event has a DueAt in the future: no
	// relay can publish them now, so a NOTIFY would only cost the commit.
	allLater bool
}

// statement is one INSERT of Enqueue: enqueueSQL for a run of n events
// without a UniqueKey, uniqueSQL for one unique event.
type statement struct {
	sql  string
	args []any
	n    int
}

// statements splits the events into statements run in the events' order,
// so the ids, taken from one sequence, follow that order.
func (a *enqueueArgs) statements() []statement {
	var out []statement
	for i := 0; i < len(a.events); {
		if e := a.events[i]; e.UniqueKey != "" {
			out = append(out, statement{sql: uniqueSQL, n: 1, args: []any{e.UniqueKey, e.UniqueFor.Microseconds(),
				a.types[i], a.keys[i], a.bodies[i], a.headers[i], a.due[i], a.dests[i]}})
			i++
			continue
		}
		j := i
		for j < len(a.events) && a.events[j].UniqueKey == "" {
			j++
		}
		out = append(out, statement{sql: enqueueSQL, n: j - i,
			args: []any{a.types[i:j], a.keys[i:j], a.bodies[i:j], a.headers[i:j], a.due[i:j], a.dests[i:j]}})
		i = j
	}
	return out
}

// prepare validates events and builds the arguments of the statements.
func prepare(events []Event) (*enqueueArgs, error) {
	n := len(events)
	a := &enqueueArgs{types: make([]string, n), keys: make([]string, n), headers: make([]string, n),
		dests: make([]string, n), bodies: make([][]byte, n), due: make([]pgtype.Timestamptz, n),
		events: events, allLater: true}
	now := time.Now()
	for i, e := range events {
		if err := e.validate(i); err != nil {
			return nil, err
		}
		a.types[i], a.keys[i], a.bodies[i] = e.Type, e.Key, e.Body
		a.dests[i] = cmp.Or(e.Destination, DefaultDestination)
		a.headers[i] = "{}"
		h := e.Headers
		if e.AppID != "" || e.Priority > 0 {
			h = make(map[string]string, len(e.Headers)+2)
			for k, v := range e.Headers {
				h[k] = v
			}
			if e.AppID != "" {
				h[broker.HeaderAppID] = e.AppID
			}
			if e.Priority > 0 {
				h[broker.HeaderPriority] = strconv.Itoa(e.Priority)
			}
		}
		if len(h) > 0 {
			b, err := json.Marshal(h)
			if err != nil {
				return nil, fmt.Errorf("%w: events[%d].Headers: %v", ErrInvalidEvent, i, err)
			}
			a.headers[i] = string(b)
		}
		if !e.DueAt.IsZero() {
			// PostgreSQL keeps microseconds and rounds to the nearest
			// one; round up here so the row is never due before DueAt.
			d := e.DueAt.Truncate(time.Microsecond)
			if d.Before(e.DueAt) {
				d = d.Add(time.Microsecond)
			}
			a.due[i] = pgtype.Timestamptz{Time: d, Valid: true}
		}
		if !e.DueAt.After(now) {
			a.allLater = false
		}
	}
	return a, nil
}

// Enqueue stores events in the outbox inside the caller's transaction tx,
// so they are published if and only if tx commits, and returns their row
// ids (the broker.Message.ID the relay publishes them under, as decimal
// strings) in the order of events. The events are inserted in one round
// trip: one statement for the events without a UniqueKey (one per run of
// them between unique events) and one per unique event. An event whose
// UniqueKey is still inside the window of an earlier event is not
// inserted, and its id is that earlier event's (see the package
// documentation, "Unique events"). The same transaction sends a NOTIFY on NotifyChannel that
// wakes the relays when it commits, unless another Enqueue of this process
// on the same database did so less than the notify window ago
// (SetNotifyWindow, default 2 ms; see the package documentation,
// "Latency", for what a row without its own NOTIFY waits). Every event is validated first; an
// invalid one fails the call with an error wrapping ErrInvalidEvent that
// names it, and nothing is inserted. With no events it does nothing and
// returns nil, nil. A database error is returned wrapped and leaves tx
// aborted, as any failed statement does. When every event has a DueAt in
// the future no NOTIFY is sent: the relay's poll finds them once due.
func Enqueue(ctx context.Context, tx pgx.Tx, events ...Event) ([]int64, error) {
	if tx == nil {
		return nil, errors.New("outbox: enqueue: tx is nil")
	}
	if len(events) == 0 {
		return nil, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	a, err := prepare(events)
	if err != nil {
		return nil, err
	}
	stmts := a.statements()
	batch := &pgx.Batch{}
	for _, st := range stmts {
		batch.Queue(st.sql, st.args...)
	}
	notify, forget := false, func() {}
	if !a.allLater {
		notify, forget = shouldNotify(tx)
	}
	if notify {
		batch.Queue("SELECT pg_notify($1, '')", NotifyChannel)
	}
	br := tx.SendBatch(ctx, batch)
	ids := make([]int64, 0, len(events))
	for _, st := range stmts {
		if err != nil {
			break
		}
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			start := len(ids)
			ids, err = pgx.AppendRows(ids, rows, pgx.RowTo[int64])
			// The ids of one statement come from one sequence, assigned
			// in the order of ORDER BY ord, so ascending ids are the
			// events' order whatever order RETURNING used.
			slices.Sort(ids[start:])
			if err == nil && len(ids)-start != st.n {
				err = fmt.Errorf("inserted %d rows for %d events", len(ids)-start, st.n)
			}
		}
	}
	if err == nil && notify {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		forget()
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, ctxErr
		}
		return nil, fmt.Errorf("outbox: enqueue: %w", err)
	}
	return ids, nil
}
