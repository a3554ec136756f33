package ferry_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// attemptLog counts the attempts of each event type.
type attemptLog struct {
	mu sync.Mutex
	m  map[string][]int
}

func (a *attemptLog) add(typ string, attempt int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil {
		a.m = map[string][]int{}
	}
	a.m[typ] = append(a.m[typ], attempt)
}

func (a *attemptLog) of(typ string) []int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]int(nil), a.m[typ]...)
}

type job struct {
	N int `json:"n"`
}

// TestMuxOptionsAndMiddlewareOnEveryBroker: through ferry.New, a Mux set
// as the worker's Router applies each type's max attempts (1 and 2),
// while a type without options takes the worker's policy (3); a handler
// that panics on every attempt, under Recover, fails each attempt with
// its stack in the log and is dead-lettered by its type's policy; the
// worker keeps handling afterwards; Logging logs every attempt.
func TestMuxOptionsAndMiddlewareOnEveryBroker(t *testing.T) {
	forEachBroker(t, func(t *testing.T, name string) {
		types := []string{"job.fragile", "job.sturdy", "job.panics", "job.ok"}
		bu := setup(t, name, types...)
		ctx := bu.ctx
		var (
			buf      lockedBuffer
			attempts attemptLog
		)
		logger := slog.New(slog.NewJSONHandler(&buf, nil))
		mux := ferry.NewMux()
		mux.Use(ferry.Logging(logger), ferry.Recover(logger))
		failing := func(ctx context.Context, tx pgx.Tx, j *ferry.Job[job]) error {
			attempts.add(j.Type, j.Attempt)
			return fmt.Errorf("%s %d fails on attempt %d", j.Type, j.Args.N, j.Attempt)
		}
		require.NoError(t, ferry.Handle(mux, "job.fragile", failing, ferry.WithMaxAttempts(1)))
		require.NoError(t, ferry.Handle(mux, "job.sturdy", failing))
		require.NoError(t, ferry.Handle(mux, "job.panics", func(ctx context.Context, tx pgx.Tx, j *ferry.Job[job]) error {
			attempts.add(j.Type, j.Attempt)
			var m map[int]int
			m[j.Args.N] = 1 // panics: nil map
			return nil
		}, ferry.WithMaxAttempts(2), ferry.WithRetryDelays(time.Second)))
		require.NoError(t, ferry.Handle(mux, "job.ok", func(ctx context.Context, tx pgx.Tx, j *ferry.Job[job]) error {
			attempts.add(j.Type, j.Attempt)
			return nil
		}))
		bu.start(t, ferry.Config{
			Relay: &outbox.RelayConfig{},
			Workers: []worker.Config{{Queue: bu.queue, Router: mux,
				Policy: worker.BackoffPolicy{MaxAttempts: 3, Delays: []time.Duration{time.Second}}}},
			Logger: slog.New(slog.DiscardHandler),
		})
		var ids []int64
		require.NoError(t, pgx.BeginFunc(ctx, bu.pool, func(tx pgx.Tx) error {
			for i, typ := range types[:3] {
				id, err := ferry.Enqueue(ctx, tx, typ, job{N: i})
				if err != nil {
					return err
				}
				ids = append(ids, id)
			}
			return nil
		}))
		var reasons map[string]string
		require.Eventually(t, func() bool {
			dlq, err := bu.b.DLQ(bu.queue) // known once Run declared the topology
			if err != nil {
				return false
			}
			if _, err := dlq.List(ctx, 0); err != nil {
				return false
			}
			reasons = deadReasons(t, dlq)
			return len(reasons) >= 3
		}, 60*time.Second, 100*time.Millisecond, "DLQ: %v", reasons)
		require.Contains(t, reasons[itoa(ids[0])], "job.fragile 0 fails on attempt 1")
		require.Contains(t, reasons[itoa(ids[1])], "job.sturdy 1 fails on attempt 3")
		require.Contains(t, reasons[itoa(ids[2])], worker.ErrPanic.Error())
		require.Contains(t, reasons[itoa(ids[2])], "assignment to entry in nil map")
		require.Equal(t, []int{1}, attempts.of("job.fragile"), "WithMaxAttempts(1): no retry")
		require.Equal(t, []int{1, 2, 3}, attempts.of("job.sturdy"), "no option: the worker's 3 attempts")
		require.Equal(t, []int{1, 2}, attempts.of("job.panics"), "WithMaxAttempts(2)")

		// The worker survived the panics and keeps handling.
		require.NoError(t, pgx.BeginFunc(ctx, bu.pool, func(tx pgx.Tx) error {
			_, err := ferry.Enqueue(ctx, tx, "job.ok", job{N: 3})
			return err
		}))
		require.Eventually(t, func() bool { return len(attempts.of("job.ok")) == 1 }, 30*time.Second, 50*time.Millisecond)

		logs := buf.String()
		require.Equal(t, 2, strings.Count(logs, `"msg":"ferry: handler panicked"`), "one stack per panicking attempt")
		require.Contains(t, logs, `"stack":"goroutine`)
		require.Contains(t, logs, "mux_options_integration_test.go", "the stack names the panicking line")
		require.Equal(t, 1+3+2, strings.Count(logs, `"msg":"ferry: handler failed"`), "Logging, outside Recover, sees every failed attempt")
		require.Equal(t, 1, strings.Count(logs, `"msg":"ferry: handled"`))
	})
}

// TestWorkerRefusesHandlerAndRouter: a worker gets its handler one way.
func TestWorkerRefusesHandlerAndRouter(t *testing.T) {
	t.Parallel()
	bu := setup(t, "rabbitmq", "x")
	mux := ferry.NewMux()
	_, err := worker.New(worker.Config{Consumer: "c", Queue: bu.queue, Pool: bu.pool, Broker: bu.b, Router: mux, Handler: mux.HandleMessage})
	require.ErrorIs(t, err, worker.ErrInvalidConfig)
	require.ErrorContains(t, err, "Config.Router")
}
