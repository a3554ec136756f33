package ferry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/worker"
)

// Middleware wraps a handler for cross-cutting work (logging, recovery,
// timeouts, metrics, tracing): it returns a handler that does its work
// around a call of next, and returns next's result or an error of its
// own (nil acks, an error fails the attempt: worker.Handler). It must be
// safe for concurrent use. The model is net/http's handler chains and
// Watermill's router middleware.
type Middleware func(next worker.Handler) worker.Handler

// Use appends middleware to the Mux. It wraps every message the Mux
// handles, the ones no pattern matches included (whose ErrNoHandler it
// sees as next's error), outside the decoding of Handle. The first
// middleware given to the first Use is the outermost: after
// m.Use(a, b); m.Use(c) a message runs a → b → c → the handler, and the
// results return through c, b, a. Like Handle, call it before the worker
// runs; a nil middleware is ignored.
func (m *Mux) Use(mw ...Middleware) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, f := range mw {
		if f != nil {
			m.mws = append(m.mws, f)
		}
	}
	if len(m.mws) == 0 {
		return
	}
	h := worker.Handler(m.dispatch)
	for i := len(m.mws) - 1; i >= 0; i-- {
		h = m.mws[i](h)
	}
	m.chain = h
}

// Recover returns middleware that turns a panic of the handlers inside it
// into a failed attempt: the error wraps worker.ErrPanic and carries the
// panic value, and logger (slog.Default() when nil) receives the stack at
// ERROR with the message's id, type and attempt. The attempt is then
// retried or dead-lettered under the type's policy, like any error; the
// worker never crashes. The worker recovers a panic by itself too; put
// Recover inside middleware that should see the panic as an error (e.g.
// after Logging: m.Use(Logging(l), Recover(l))).
func Recover(logger *slog.Logger) Middleware {
	if logger == nil {
		logger = slog.Default()
	}
	return func(next worker.Handler) worker.Handler {
		return func(ctx context.Context, tx pgx.Tx, msg *broker.Message) (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("%w: %v", worker.ErrPanic, r)
					logger.ErrorContext(ctx, "ferry: handler panicked", append(messageAttrs(msg),
						"panic", fmt.Sprint(r), "stack", string(debug.Stack()))...)
				}
			}()
			return next(ctx, tx, msg)
		}
	}
}

// Timeout returns middleware that bounds each attempt of the handlers
// inside it: their ctx is cancelled d after the attempt began, and an
// error returned after that wraps worker.ErrHandlerTimeout (an ordinary
// failed attempt). It waits for the handler to return, since the handler
// holds the transaction; a handler that may ignore its ctx needs the
// worker's bound instead (WithTimeout at Handle, or
// worker.Config.HandlerTimeout), which abandons it and settles the
// delivery. d ≤ 0 means no bound (the middleware passes through).
func Timeout(d time.Duration) Middleware {
	return func(next worker.Handler) worker.Handler {
		if d <= 0 {
			return next
		}
		return func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
			tctx, cancel := context.WithTimeout(ctx, d)
			defer cancel()
			err := next(tctx, tx, msg)
			if err != nil && errors.Is(tctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil && !errors.Is(err, worker.ErrHandlerTimeout) {
				err = fmt.Errorf("%w after %v: %w", worker.ErrHandlerTimeout, d, err)
			}
			return err
		}
	}
}

// Logging returns middleware that logs every attempt to logger
// (slog.Default() when nil) with the message's message_id, type, key,
// app_id and attempt and the attempt's duration: "ferry: handled" at INFO
// when it succeeded, "ferry: handler failed" at WARN with err when it
// failed (the worker then logs the retry or the DLQ itself).
func Logging(logger *slog.Logger) Middleware {
	if logger == nil {
		logger = slog.Default()
	}
	return func(next worker.Handler) worker.Handler {
		return func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
			start := time.Now()
			err := next(ctx, tx, msg)
			attrs := append(messageAttrs(msg), "duration", time.Since(start))
			if err != nil {
				logger.WarnContext(ctx, "ferry: handler failed", append(attrs, "err", err)...)
			} else {
				logger.InfoContext(ctx, "ferry: handled", attrs...)
			}
			return err
		}
	}
}

// messageAttrs are the log attributes of msg.
func messageAttrs(msg *broker.Message) []any {
	if msg == nil {
		return nil
	}
	attrs := []any{"message_id", msg.ID, "type", msg.Type, "attempt", msg.Attempt}
	if msg.Key != "" {
		attrs = append(attrs, "key", msg.Key)
	}
	if id := msg.Headers[broker.HeaderAppID]; id != "" {
		attrs = append(attrs, "app_id", id)
	}
	return attrs
}
