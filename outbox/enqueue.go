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

// Event is one event to publish through the outbox.
type Event struct {
	// Type is the event type and routing key, e.g. "notification.requested":
	// non-empty dot-separated words without '*' or '#', at most
	// MaxTypeBytes bytes of valid UTF-8. Required.
	Type string
	// Key is the ordering (partition) key, e.g. a user id; see
	// broker.Message.Key. Optional.
	Key string
	// Body is the payload, opaque bytes. Required (non-nil; it may be empty).
	Body []byte
	// Headers are carried with the message, e.g. broker.HeaderTraceparent.
	// Keys must be non-empty and must not start with "x-", which is
	// reserved for ferry's own headers. May be nil.
	Headers map[string]string
	// AppID is the application's own id of what the event is about (e.g.
	// the notification id), carried as the header broker.HeaderAppID so
	// an operator finds the message by the id the application's API uses
	// ("ferry dlq list" shows it and filters on it with --app-id).
	// Optional; at most MaxAppIDBytes bytes of valid UTF-8 without control
	// characters.
	AppID string
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
	if !utf8.ValidString(e.Key) || strings.ContainsRune(e.Key, 0) {
		return fmt.Errorf("%w: %s %q: must be valid UTF-8 without NUL", ErrInvalidEvent, field("Key"), e.Key)
	}
	if e.Body == nil {
		return fmt.Errorf("%w: %s: is nil (use []byte{} for an empty body)", ErrInvalidEvent, field("Body"))
	}
	if len(e.AppID) > MaxAppIDBytes || !utf8.ValidString(e.AppID) ||
		strings.ContainsFunc(e.AppID, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return fmt.Errorf("%w: %s %q: want at most %d bytes of valid UTF-8 without control characters", ErrInvalidEvent, field("AppID"), clipID(e.AppID), MaxAppIDBytes)
	}
	for k, v := range e.Headers {
		switch {
		case k == "":
			return fmt.Errorf("%w: %s: empty key", ErrInvalidEvent, field("Headers"))
		case strings.HasPrefix(strings.ToLower(k), "x-"):
			return fmt.Errorf("%w: %s[%q]: keys starting with \"x-\" are reserved for ferry", ErrInvalidEvent, field("Headers"), k)
		case !utf8.ValidString(k) || !utf8.ValidString(v) || strings.ContainsRune(k, 0) || strings.ContainsRune(v, 0):
			return fmt.Errorf("%w: %s[%q]: key and value must be valid UTF-8 without NUL", ErrInvalidEvent, field("Headers"), k)
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
		if strings.ContainsAny(w, "*#") {
			return errors.New("must not contain '*' or '#' (a routing key, not a pattern)")
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
