package ferrycli

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferrymq/ferry/worker"
)

// ShutdownMargin is how much longer than --shutdown-timeout the
// long-running commands (api, relay, worker, run) take at most, after
// SIGINT/SIGTERM, to return (and the process to exit): the worker's
// ShutdownGrace (worker.ShutdownGrace, 2 s) for handlers cancelled at the
// timeout, plus closing the broker and database connections. A process
// supervisor's grace period (Kubernetes terminationGracePeriodSeconds,
// systemd TimeoutStopSec) should be at least --shutdown-timeout +
// ShutdownMargin. Work still running then is abandoned: its deliveries
// are unsettled and the broker redelivers them; its database
// transactions roll back when the process exits.
const ShutdownMargin = worker.ShutdownGrace + 3*time.Second

// poolCloseWait bounds the wait for the database pool to close at exit:
// pgxpool's Close waits for every connection to be released, and a
// handler abandoned at the shutdown timeout may hold one.
const poolCloseWait = time.Second

// boundShutdown runs f and returns its error; once ctx is done it waits at
// most timeout + ShutdownMargin for f to return, then returns an error
// saying that the command stopped with work unsettled (exit code 1),
// leaving f to be ended by the process exit.
func boundShutdown(ctx context.Context, timeout time.Duration, log *slog.Logger, f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	t := time.NewTimer(timeout + ShutdownMargin)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		log.Error("ferry: shutdown took longer than --shutdown-timeout plus the margin; exiting with work unsettled, which the broker redelivers",
			"shutdown_timeout", timeout, "margin", ShutdownMargin)
		return fmt.Errorf("ferry: shutdown: still running %v after the stop signal (--%s %v + %v); exited with work unsettled",
			timeout+ShutdownMargin, flagShutdownTimeout, timeout, ShutdownMargin)
	}
}

// closePool closes pool, waiting at most poolCloseWait for connections
// still held by abandoned handlers; the process exit closes those.
func closePool(pool *pgxpool.Pool, log *slog.Logger) {
	done := make(chan struct{})
	go func() { pool.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(poolCloseWait):
		log.Warn("ferry: database connections still held by handlers cancelled at the shutdown timeout; leaving them to the process exit (PostgreSQL rolls their transactions back)",
			"waited", poolCloseWait)
	}
}
