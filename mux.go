package ferry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/worker"
)

// The errors that are part of the API; they are wrapped with %w, so test
// them with errors.Is.
var (
	// ErrNoHandler is the reason a message whose Type no pattern of the Mux
	// matches is dead-lettered at once (wrapped in worker.Permanent): no
	// retry can find a handler that is not registered. Replay it from the
	// DLQ once a worker that handles the type runs.
	ErrNoHandler = errors.New("ferry: no handler for the event type")
	// ErrUndecodable is the reason a message whose body does not decode
	// into the handler's type is dead-lettered at once (wrapped in
	// worker.Permanent).
	ErrUndecodable = errors.New("ferry: event body does not decode")
	// ErrInvalidEvent is the reason a message whose body decodes but whose
	// value its Validate method refuses (Validator) is dead-lettered at
	// once (wrapped in worker.Permanent, with Validate's error wrapped
	// too). It is not ErrUndecodable: the body is well-formed, the event
	// is not acceptable.
	ErrInvalidEvent = errors.New("ferry: invalid event")
	// ErrInvalidConfig is wrapped by the errors of Mux.Handle, Handle and
	// New for a registration or Config they refuse; the message names the
	// field or the pattern.
	ErrInvalidConfig = errors.New("ferry: invalid config")
)

// Validator is implemented by an event type that checks itself after
// decoding. When the handler's type T (or *T) has a Validate method,
// Decode calls it, and an error makes the message an invalid event
// (ErrInvalidEvent, dead-lettered at once).
type Validator interface {
	// Validate returns nil for a usable value, else an error saying what
	// is wrong with it.
	Validate() error
}

// Job is one message handed to a typed handler registered with Handle:
// the received message (ID, Type, Key, Headers, Attempt) and its body
// decoded into Args.
type Job[T any] struct {
	// Message is the received message; it must not be modified.
	*broker.Message
	// Args is the message's JSON body decoded into T.
	Args T
}

// JobHandler handles one typed job inside the worker's deduplication
// transaction tx (see worker.Handler for what its return value means and
// for tx): nil acks, an ordinary error is retried under the worker's
// policy, worker.Permanent dead-letters at once, worker.RetryAfter asks
// for a delay.
type JobHandler[T any] func(ctx context.Context, tx pgx.Tx, job *Job[T]) error

// Mux routes each message to the handler registered for its Type, with
// the routing-key patterns of bindings: dot-separated words where '*'
// matches exactly one word and '#' zero or more (broker.MatchRoutingKey).
// Patterns are tried in the order they were registered; the first that
// matches handles the message. A message no pattern matches is
// dead-lettered at once with a reason wrapping ErrNoHandler, never retried
// and never dropped.
//
// A Mux serves as the worker.Handler of a worker (Mux.HandleMessage), so
// one worker handles several event types arriving on one queue; a Mux of
// HandleSQL handlers serves as its worker.SQLHandler
// (Mux.HandleMessageSQL). Register
// every handler before the worker runs; registering while it runs is safe
// but a message may miss a handler registered after it arrived. The zero
// Mux is empty and ready to use.
type Mux struct {
	mu     sync.RWMutex
	routes []route
}

type route struct {
	pattern string
	h       worker.Handler    // Handle's; nil for a HandleSQL route
	hs      worker.SQLHandler // HandleSQL's (mux_sql.go)
}

// NewMux returns an empty Mux.
func NewMux() *Mux { return &Mux{} }

// Handle registers h for the event types that match pattern. It returns an
// error wrapping ErrInvalidConfig for an invalid pattern (see
// broker.ValidatePattern), a nil h, or a pattern already registered.
func (m *Mux) Handle(pattern string, h worker.Handler) error {
	if err := broker.ValidatePattern(pattern); err != nil {
		return fmt.Errorf("%w: mux: %v", ErrInvalidConfig, err)
	}
	if h == nil {
		return fmt.Errorf("%w: mux: pattern %q: nil handler", ErrInvalidConfig, pattern)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.routes {
		if r.pattern == pattern {
			return fmt.Errorf("%w: mux: pattern %q registered twice", ErrInvalidConfig, pattern)
		}
	}
	m.routes = append(m.routes, route{pattern: pattern, h: h})
	return nil
}

// Patterns returns the registered patterns in registration order, e.g. to
// bind them: broker.Queue{Bindings: mux.Patterns()}.
func (m *Mux) Patterns() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]string, len(m.routes))
	for i, r := range m.routes {
		out[i] = r.pattern
	}
	return out
}

// Handler returns the handler the first matching pattern registered for
// eventType, and that pattern; nil and "" when none matches, nil and the
// pattern when it was registered with HandleSQL.
func (m *Mux) Handler(eventType string) (h worker.Handler, pattern string) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, r := range m.routes {
		if broker.MatchRoutingKey(r.pattern, eventType) {
			return r.h, r.pattern
		}
	}
	return nil, ""
}

// HandleMessage is the worker.Handler of the Mux: set
// worker.Config.Handler to mux.HandleMessage. It runs the handler of
// msg.Type and returns its result; for a Type no pattern matches it
// returns worker.Permanent of an error wrapping ErrNoHandler that names
// the type and the registered patterns, and for a handler registered with
// HandleSQL one wrapping ErrWrongTransaction.
func (m *Mux) HandleMessage(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
	if msg == nil {
		return worker.Permanent(fmt.Errorf("%w: nil message", ErrNoHandler))
	}
	h, pattern := m.Handler(msg.Type)
	if h == nil && pattern != "" {
		return wrongTxForPgx(msg, pattern)
	}
	if h == nil {
		return worker.Permanent(fmt.Errorf("%w %q (message %s; this worker handles: %s)",
			ErrNoHandler, msg.Type, msg.ID, strings.Join(m.Patterns(), ", ")))
	}
	return h(ctx, tx, msg)
}

// Handle registers on m a typed handler for the event types that match
// pattern: the worker decodes each message's JSON body into a T (Decode)
// and calls h with it. A body that does not decode is dead-lettered at
// once with a reason wrapping ErrUndecodable, a T whose Validate method
// fails with one wrapping ErrInvalidEvent, without calling h. Errors are
// those of Mux.Handle.
func Handle[T any](m *Mux, pattern string, h JobHandler[T]) error {
	if h == nil {
		return fmt.Errorf("%w: mux: pattern %q: nil handler", ErrInvalidConfig, pattern)
	}
	return m.Handle(pattern, func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		args, err := Decode[T](msg)
		if err != nil {
			return worker.Permanent(err)
		}
		return h(ctx, tx, &Job[T]{Message: msg, Args: args})
	})
}

// Decode decodes msg's JSON body into a T with encoding/json (fields of
// the body that T does not have are ignored, so producers may add fields
// before consumers know them) and then calls T's Validate method when T
// or *T is a Validator. The error wraps ErrUndecodable (the body is not a
// JSON T) or ErrInvalidEvent and Validate's error (Validate refused it),
// and names the message, its type and T.
func Decode[T any](msg *broker.Message) (T, error) {
	var v T
	if msg == nil {
		return v, fmt.Errorf("%w: nil message", ErrUndecodable)
	}
	if err := json.Unmarshal(msg.Body, &v); err != nil {
		return v, fmt.Errorf("%w: message %s (type %s): body is not a JSON %s: %v", ErrUndecodable, msg.ID, msg.Type, typeName[T](), err)
	}
	var val Validator
	if x, ok := any(v).(Validator); ok {
		val = x
	} else if x, ok := any(&v).(Validator); ok {
		val = x
	}
	if val != nil {
		if err := val.Validate(); err != nil {
			return v, fmt.Errorf("%w: message %s (type %s): %s refused by its Validate: %w", ErrInvalidEvent, msg.ID, msg.Type, typeName[T](), err)
		}
	}
	return v, nil
}

func typeName[T any]() string {
	return reflect.TypeFor[T]().String()
}
