package ferry

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"maps"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferrymq/ferry/outbox"
)

// EnqueueOption sets an optional field of the event Enqueue stores.
type EnqueueOption func(*outbox.Event)

// WithKey sets the event's ordering (partition) key, e.g. a user id
// (outbox.Event.Key, broker.Message.Key).
func WithKey(key string) EnqueueOption { return func(e *outbox.Event) { e.Key = key } }

// WithAppID sets outbox.Event.AppID: the application's own id of what the
// event is about (e.g. an order id), carried as broker.HeaderAppID so
// "ferry dlq list" shows it and finds the message by it (--app-id). At
// most outbox.MaxAppIDBytes bytes.
func WithAppID(id string) EnqueueOption { return func(e *outbox.Event) { e.AppID = id } }

// WithHeader adds a header carried with the message, e.g.
// broker.HeaderTraceparent. Keys starting with "x-" are reserved for ferry
// and make Enqueue fail (outbox.ErrInvalidEvent).
func WithHeader(key, value string) EnqueueOption {
	return func(e *outbox.Event) {
		if e.Headers == nil {
			e.Headers = map[string]string{}
		}
		e.Headers[key] = value
	}
}

// DueAt schedules the event: the relay publishes it no earlier than t
// (outbox.Event.DueAt), and within the relay's PollInterval (500 ms by
// default) after t while the relay and the broker are up. A time already
// past publishes at once. The model is asynq's ProcessAt and River's
// ScheduledAt.
func DueAt(t time.Time) EnqueueOption { return func(e *outbox.Event) { e.DueAt = t } }

// DueIn schedules the event d after the call (DueAt(time.Now().Add(d))),
// like asynq's ProcessIn. Non-positive d publishes at once.
func DueIn(d time.Duration) EnqueueOption {
	if d <= 0 {
		return func(*outbox.Event) {}
	}
	return DueAt(time.Now().Add(d))
}

// WithDestination sets the outbox the event belongs to
// (outbox.Event.Destination): only a relay of that destination
// (Config.Destination, outbox.RelayConfig.Destination) publishes it.
// Defaults to outbox.DefaultDestination.
func WithDestination(name string) EnqueueOption {
	return func(e *outbox.Event) { e.Destination = name }
}

// WithPriority sets the event's priority (outbox.Event.Priority), 0 (the
// default, lowest) to broker.MaxPriority (4): a worker of a queue with
// priorities (broker.Queue.Priorities) takes the higher levels first.
// asynq's model (a queue per level, strict or weighted) on every broker;
// see broker.Prioritized for what it guarantees. Out of range fails the
// Enqueue with outbox.ErrInvalidEvent.
func WithPriority(p int) EnqueueOption { return func(e *outbox.Event) { e.Priority = p } }

// Unique makes the event unique by key for window (outbox.Event.UniqueKey
// and UniqueFor): an Enqueue with the same key less than window after
// this one's transaction began stores nothing and returns this event's
// id, also when the two transactions run concurrently (the second waits
// for the first to commit or roll back; after a rollback it stores its
// own event). The key is database-wide, so include the event type, e.g.
// Unique("email.welcome:"+userID, 24*time.Hour). A window below 1 µs
// fails the Enqueue with outbox.ErrInvalidEvent. The models are River's
// UniqueOpts.ByPeriod and asynq's Unique(ttl).
func Unique(key string, window time.Duration) EnqueueOption {
	return func(e *outbox.Event) { e.UniqueKey, e.UniqueFor = key, window }
}

// NewEvent encodes args as JSON into an outbox.Event of type eventType
// with opts applied, for callers that enqueue several events in one call
// (outbox.Enqueue(ctx, tx, e1, e2)). The error wraps
// outbox.ErrInvalidEvent when args does not encode or the event is
// invalid (outbox.Event.Validate names the field).
func NewEvent[T any](eventType string, args T, opts ...EnqueueOption) (outbox.Event, error) {
	body, err := json.Marshal(args)
	if err != nil {
		return outbox.Event{}, fmt.Errorf("%w: %s: encoding %s as JSON: %v", outbox.ErrInvalidEvent, eventType, typeName[T](), err)
	}
	e := outbox.Event{Type: eventType, Body: body}
	for _, o := range opts {
		o(&e)
	}
	e.Headers = maps.Clone(e.Headers)
	if err := e.Validate(); err != nil {
		return outbox.Event{}, err
	}
	return e, nil
}

// Enqueue encodes args as JSON and stores it in the outbox as an event of
// type eventType inside the caller's transaction tx (outbox.Enqueue): it
// is published if and only if tx commits, no earlier than its DueAt
// option. It returns the outbox row id, which is the message's
// broker.Message.ID; with the Unique option, the id of the key's first
// event when that is still inside its window (nothing is stored then). Errors are those of NewEvent and outbox.Enqueue (a
// database error leaves tx aborted). The consuming side is Handle with
// the same T.
func Enqueue[T any](ctx context.Context, tx pgx.Tx, eventType string, args T, opts ...EnqueueOption) (int64, error) {
	e, err := NewEvent(eventType, args, opts...)
	if err != nil {
		return 0, err
	}
	ids, err := outbox.Enqueue(ctx, tx, e)
	if err != nil {
		return 0, err
	}
	return ids[0], nil
}

// EnqueueSQL is Enqueue for database/sql users: tx must come from a
// *sql.DB of the pgx driver (github.com/jackc/pgx/v5/stdlib, registered
// as "pgx"); see outbox.EnqueueSQL.
func EnqueueSQL[T any](ctx context.Context, tx *sql.Tx, eventType string, args T, opts ...EnqueueOption) (int64, error) {
	e, err := NewEvent(eventType, args, opts...)
	if err != nil {
		return 0, err
	}
	ids, err := outbox.EnqueueSQL(ctx, tx, e)
	if err != nil {
		return 0, err
	}
	return ids[0], nil
}

// EnqueueMany encodes each of args as JSON and stores them in the outbox
// as events of type eventType inside the caller's transaction tx, with
// opts applied to every event, in one round trip: one multi-row INSERT
// for all of them (outbox.Enqueue; an event with the Unique option costs
// a statement of its own in the same round trip). It returns the outbox
// row ids in the order of args. Events with their own options (a key per
// user, say) are built with NewEvent and stored with outbox.Enqueue,
// which takes the same path. Every arg is encoded and validated first:
// an invalid one fails the call with an error wrapping
// outbox.ErrInvalidEvent that names its index, and nothing is stored.
// With no args it does nothing and returns nil, nil. A database error
// leaves tx aborted. The model is River's InsertMany.
func EnqueueMany[T any](ctx context.Context, tx pgx.Tx, eventType string, args []T, opts ...EnqueueOption) ([]int64, error) {
	events, err := newEvents(eventType, args, opts)
	if err != nil || len(events) == 0 {
		return nil, err
	}
	return outbox.Enqueue(ctx, tx, events...)
}

// EnqueueManySQL is EnqueueMany for database/sql users: tx must come from
// a *sql.DB of the pgx driver (github.com/jackc/pgx/v5/stdlib); see
// outbox.EnqueueSQL.
func EnqueueManySQL[T any](ctx context.Context, tx *sql.Tx, eventType string, args []T, opts ...EnqueueOption) ([]int64, error) {
	events, err := newEvents(eventType, args, opts)
	if err != nil || len(events) == 0 {
		return nil, err
	}
	return outbox.EnqueueSQL(ctx, tx, events...)
}

// newEvents is NewEvent for each of args, its error naming the index.
func newEvents[T any](eventType string, args []T, opts []EnqueueOption) ([]outbox.Event, error) {
	events := make([]outbox.Event, len(args))
	for i, a := range args {
		e, err := NewEvent(eventType, a, opts...)
		if err != nil {
			return nil, fmt.Errorf("ferry: enqueue: args[%d]: %w", i, err)
		}
		events[i] = e
	}
	return events, nil
}
