package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
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
	for k, v := range e.Headers {
		if err := validateHeader(k, v); err != nil {
			return fmt.Errorf("%w: %s[%q]: %s", ErrInvalidEvent, field("Headers"), k, err)
		}
	}
	return nil
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

const enqueueSQL = `INSERT INTO outbox (event_type, partition_key, payload, headers)
SELECT t, k, p, h
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::jsonb[]) WITH ORDINALITY AS e(t, k, p, h, ord)
ORDER BY ord
RETURNING id`

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
// aborted, as any failed statement does.
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
	types := make([]string, len(events))
	keys := make([]string, len(events))
	bodies := make([][]byte, len(events))
	headers := make([]string, len(events))
	for i, e := range events {
		if err := e.validate(i); err != nil {
			return nil, err
		}
		types[i], keys[i], bodies[i] = e.Type, e.Key, e.Body
		headers[i] = "{}"
		if len(e.Headers) > 0 {
			b, err := json.Marshal(e.Headers)
			if err != nil {
				return nil, fmt.Errorf("%w: events[%d].Headers: %v", ErrInvalidEvent, i, err)
			}
			headers[i] = string(b)
		}
	}
	batch := &pgx.Batch{}
	batch.Queue(enqueueSQL, types, keys, bodies, headers)
	notify, forget := shouldNotify(tx)
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
