package ferry_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/worker"
)

type invoice struct {
	Customer string `json:"customer"`
	N        int    `json:"n"`
}

// A provider answers 429 Too Many Requests twice: the handler returns
// ferry.RetryAfter, the message comes back later, and the attempt is not
// counted, so a type with a single attempt (WithMaxAttempts(1)) is still
// handled, and every delivery is attempt 1. Runs on every broker the
// ferry command wires, against the real servers.
func ExampleRetryAfter() {
	out, err := onEveryBroker(func(ctx context.Context, name string, pool *pgxpool.Pool, b broker.Broker, printf func(string, ...any)) error {
		mux := ferry.NewMux()
		sent := make(chan struct{})
		var calls atomic.Int32
		err := ferry.Handle(mux, "mail.send", func(ctx context.Context, tx pgx.Tx, job *ferry.Job[mail]) error {
			n := calls.Add(1)
			if n <= 2 {
				printf("call %d, attempt %d: provider says 429, retry after 100ms", n, job.Attempt)
				return ferry.RetryAfter(100 * time.Millisecond) // RabbitMQ, Kafka: the queue's 1 s retry level
			}
			printf("call %d, attempt %d: sent to %s", n, job.Attempt, job.Args.To)
			close(sent)
			return nil
		}, ferry.WithMaxAttempts(1))
		if err != nil {
			return err
		}
		run, err := runPipeline(ctx, pool, b, mux, worker.Config{})
		if err != nil {
			return err
		}
		defer run()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := ferry.Enqueue(ctx, tx, "mail.send", mail{To: "ada@example.com"})
			return err
		}); err != nil {
			return err
		}
		return waitAll(ctx, sent)
	}, keepOrder)
	if err != nil {
		fmt.Println(err)
	}
	fmt.Print(out)
	// Output:
	// call 1, attempt 1: provider says 429, retry after 100ms
	// call 2, attempt 1: provider says 429, retry after 100ms
	// call 3, attempt 1: sent to ada@example.com
}

// At most one invoice per customer at once, across every worker replica
// sharing the database: WithConcurrency(1) partitioned by the message's
// Key. The invoices over the limit are snoozed (not counted as attempts)
// and come back. Runs on every broker the ferry command wires, against
// the real servers.
func ExampleWithConcurrency() {
	out, err := onEveryBroker(func(ctx context.Context, name string, pool *pgxpool.Pool, b broker.Broker, printf func(string, ...any)) error {
		mux := ferry.NewMux()
		var (
			mu      sync.Mutex
			running = map[string]int{}
			peak    = map[string]int{}
			handled int
		)
		done := make(chan struct{})
		err := ferry.Handle(mux, "invoice.render", func(ctx context.Context, tx pgx.Tx, job *ferry.Job[invoice]) error {
			mu.Lock()
			running[job.Key]++
			peak[job.Key] = max(peak[job.Key], running[job.Key])
			mu.Unlock()
			time.Sleep(50 * time.Millisecond) // rendering
			mu.Lock()
			defer mu.Unlock()
			running[job.Key]--
			if handled++; handled == 6 {
				close(done)
			}
			return nil
		}, ferry.WithConcurrency(1,
			ferry.PartitionBy(func(m *broker.Message) string { return m.Key }),
			ferry.WithLimitDelay(200*time.Millisecond)))
		if err != nil {
			return err
		}
		run, err := runPipeline(ctx, pool, b, mux, worker.Config{})
		if err != nil {
			return err
		}
		defer run()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for i := range 6 {
				c := []string{"acme", "globex"}[i%2]
				if _, err := ferry.Enqueue(ctx, tx, "invoice.render", invoice{Customer: c, N: i}, ferry.WithKey(c)); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return err
		}
		if err := waitAll(ctx, done); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		printf("handled %d invoices; at most %d at once for acme, %d for globex", handled, peak["acme"], peak["globex"])
		return nil
	})
	if err != nil {
		fmt.Println(err)
	}
	fmt.Print(out)
	// Output:
	// handled 6 invoices; at most 1 at once for acme, 1 for globex
}

// No more than 10 calls a second to a provider, with no burst, across
// every worker replica sharing the database: WithRateLimit(10, 1). Five
// jobs enqueued at once start at least 100 ms apart; the early ones are
// snoozed until their turn. Runs on every broker the ferry command wires,
// against the real servers.
func ExampleWithRateLimit() {
	out, err := onEveryBroker(func(ctx context.Context, name string, pool *pgxpool.Pool, b broker.Broker, printf func(string, ...any)) error {
		mux := ferry.NewMux()
		var (
			mu     sync.Mutex
			starts []time.Time
		)
		done := make(chan struct{})
		err := ferry.Handle(mux, "provider.call", func(ctx context.Context, tx pgx.Tx, job *ferry.Job[job]) error {
			var now time.Time
			// The database's clock, the one the limit runs on.
			if err := tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			if starts = append(starts, now); len(starts) == 5 {
				close(done)
			}
			return nil
		}, ferry.WithRateLimit(10, 1))
		if err != nil {
			return err
		}
		run, err := runPipeline(ctx, pool, b, mux, worker.Config{})
		if err != nil {
			return err
		}
		defer run()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for i := range 5 {
				if _, err := ferry.Enqueue(ctx, tx, "provider.call", job{N: i}); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return err
		}
		if err := waitAll(ctx, done); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		first, last := starts[0], starts[0]
		for _, s := range starts {
			first, last = minTime(first, s), maxTime(last, s)
		}
		// The limit spaces the starts by 100 ms as the database's now()
		// sees them; the handler reads the clock a little later.
		printf("5 calls over at least 390ms: %v", last.Sub(first) >= 390*time.Millisecond)
		return nil
	})
	if err != nil {
		fmt.Println(err)
	}
	fmt.Print(out)
	// Output:
	// 5 calls over at least 390ms: true
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
