package ferry

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/worker"
)

// ErrWrongTransaction is the reason a message is dead-lettered at once
// (wrapped in worker.Permanent) when its handler needs the other kind of
// transaction than the worker gives: a HandleSQL handler reached through
// Mux.HandleMessage (a pgx.Tx), or a Handle handler through
// Mux.HandleMessageSQL (a *sql.Tx). Fix the worker's configuration
// (worker.Config.SQLHandler = mux.HandleMessageSQL for a Mux of HandleSQL
// handlers) and replay the DLQ.
var ErrWrongTransaction = errors.New("ferry: the handler needs the other kind of transaction")

// SQLJobHandler is JobHandler for services on database/sql: it handles
// one typed job inside the worker's deduplication transaction tx, a
// *sql.Tx of pgx's stdlib driver (see worker.SQLHandler), with the same
// return values.
type SQLJobHandler[T any] func(ctx context.Context, tx *sql.Tx, job *Job[T]) error

// HandleSQL registers on m a typed handler, taking a *sql.Tx, for the
// event types that match pattern: it is Handle for database/sql code. The
// handler's writes through tx commit with the worker's dedup row, or not
// at all. Serve such a Mux with worker.Config.SQLHandler =
// m.HandleMessageSQL (a Mux serves one kind: a message reaching a handler
// of the other kind is dead-lettered with ErrWrongTransaction). Decoding
// is Decode's, as for Handle. Errors are those of Mux.Handle.
func HandleSQL[T any](m *Mux, pattern string, h SQLJobHandler[T]) error {
	if h == nil {
		return fmt.Errorf("%w: mux: pattern %q: nil handler", ErrInvalidConfig, pattern)
	}
	return m.handleSQL(pattern, func(ctx context.Context, tx *sql.Tx, msg *broker.Message) error {
		args, err := Decode[T](msg)
		if err != nil {
			return worker.Permanent(err)
		}
		return h(ctx, tx, &Job[T]{Message: msg, Args: args})
	})
}

// handleSQL is Mux.Handle for a worker.SQLHandler.
func (m *Mux) handleSQL(pattern string, h worker.SQLHandler) error {
	if err := broker.ValidatePattern(pattern); err != nil {
		return fmt.Errorf("%w: mux: %v", ErrInvalidConfig, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.routes {
		if r.pattern == pattern {
			return fmt.Errorf("%w: mux: pattern %q registered twice", ErrInvalidConfig, pattern)
		}
	}
	m.routes = append(m.routes, route{pattern: pattern, hs: h})
	return nil
}

// route returns the first route matching eventType.
func (m *Mux) route(eventType string) (route, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, r := range m.routes {
		if broker.MatchRoutingKey(r.pattern, eventType) {
			return r, true
		}
	}
	return route{}, false
}

// HandleMessageSQL is the worker.SQLHandler of the Mux: set
// worker.Config.SQLHandler to mux.HandleMessageSQL to serve handlers
// registered with HandleSQL. It runs the handler of msg.Type and returns
// its result; for a Type no pattern matches it returns worker.Permanent
// of an error wrapping ErrNoHandler, and for a handler registered with
// Handle (it needs a pgx.Tx) one wrapping ErrWrongTransaction.
func (m *Mux) HandleMessageSQL(ctx context.Context, tx *sql.Tx, msg *broker.Message) error {
	if msg == nil {
		return worker.Permanent(fmt.Errorf("%w: nil message", ErrNoHandler))
	}
	r, ok := m.route(msg.Type)
	switch {
	case !ok:
		return worker.Permanent(fmt.Errorf("%w %q (message %s; this worker handles: %s)",
			ErrNoHandler, msg.Type, msg.ID, strings.Join(m.Patterns(), ", ")))
	case r.hs == nil:
		return worker.Permanent(fmt.Errorf("%w: message %s (type %s): pattern %q was registered with Handle (a pgx.Tx) but the worker runs Mux.HandleMessageSQL (a *sql.Tx)",
			ErrWrongTransaction, msg.ID, msg.Type, r.pattern))
	}
	return r.hs(ctx, tx, msg)
}

// wrongTxForPgx is HandleMessage's error for a HandleSQL route.
func wrongTxForPgx(msg *broker.Message, pattern string) error {
	return worker.Permanent(fmt.Errorf("%w: message %s (type %s): pattern %q was registered with HandleSQL (a *sql.Tx) but the worker runs Mux.HandleMessage (a pgx.Tx); set worker.Config.SQLHandler = mux.HandleMessageSQL",
		ErrWrongTransaction, msg.ID, msg.Type, pattern))
}

var _ worker.Handler = (*Mux)(nil).HandleMessage
var _ worker.SQLHandler = (*Mux)(nil).HandleMessageSQL
