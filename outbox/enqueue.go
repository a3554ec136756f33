package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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
}

// MaxAppIDBytes bounds Event.AppID (bytes).
const MaxAppIDBytes = 255

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
const enqueueSQL = `INSERT INTO outbox (event_type, partition_key, payload, headers, next_attempt_at, occurred_at)
SELECT t, k, p, h, d, GREATEST(now(), d)
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::jsonb[], $5::timestamptz[]) WITH ORDINALITY AS e(t, k, p, h, d, ord)
ORDER BY ord
RETURNING id`

// enqueueArgs are the arrays enqueueSQL inserts, one element per event.
type enqueueArgs struct {
	types, keys, headers []string
	bodies               [][]byte
	due                  []pgtype.Timestamptz
	// allLater is true when every event has a DueAt in the future: no
	// relay can publish them now, so a NOTIFY would only cost the commit.
	allLater bool
}

// prepare validates events and builds the arguments of enqueueSQL.
func prepare(events []Event) (*enqueueArgs, error) {
	n := len(events)
	a := &enqueueArgs{types: make([]string, n), keys: make([]string, n), headers: make([]string, n),
		bodies: make([][]byte, n), due: make([]pgtype.Timestamptz, n), allLater: true}
	now := time.Now()
	for i, e := range events {
		if err := e.validate(i); err != nil {
			return nil, err
		}
		a.types[i], a.keys[i], a.bodies[i] = e.Type, e.Key, e.Body
		a.headers[i] = "{}"
		h := e.Headers
		if e.AppID != "" {
			h = make(map[string]string, len(e.Headers)+1)
			for k, v := range e.Headers {
				h[k] = v
			}
			h[broker.HeaderAppID] = e.AppID
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
// strings) in the order of events. All events are inserted by one
// statement, and the same transaction sends a NOTIFY on NotifyChannel that
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
	batch := &pgx.Batch{}
	batch.Queue(enqueueSQL, a.types, a.keys, a.bodies, a.headers, a.due)
	notify, forget := false, func() {}
	if !a.allLater {
		notify, forget = shouldNotify(tx)
	}
	if notify {
		batch.Queue("SELECT pg_notify($1, '')", NotifyChannel)
	}
	br := tx.SendBatch(ctx, batch)
	ids := make([]int64, 0, len(events))
	rows, err := br.Query()
	if err == nil {
		ids, err = pgx.AppendRows(ids, rows, pgx.RowTo[int64])
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
	if len(ids) != len(events) {
		return nil, fmt.Errorf("outbox: enqueue: inserted %d rows for %d events", len(ids), len(events))
	}
	// The ids come from one sequence, assigned in the order of ORDER BY ord,
	// so ascending ids are the events' order whatever order RETURNING used.
	slices.Sort(ids)
	return ids, nil
}
