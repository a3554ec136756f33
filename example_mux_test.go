package ferry_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/cmd/ferry/ferrycli"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

type report struct {
	ID int `json:"id"`
}

type mail struct {
	To string `json:"to"`
}

// Per-type options: a report build may take at most 300 ms per attempt
// and 3 attempts, a mail gets a single attempt, while the worker's own
// settings stay for every other type. The Mux is the worker's Router, so
// the worker applies them (and checks them against the broker at start).
// Runs on every broker the ferry command wires, against the real servers.
func ExampleWithMaxAttempts() {
	out, err := onEveryBroker(func(ctx context.Context, name string, pool *pgxpool.Pool, b broker.Broker, printf func(string, ...any)) error {
		mux := ferry.NewMux()
		built := make(chan struct{})
		err := ferry.Handle(mux, "report.build", func(ctx context.Context, tx pgx.Tx, job *ferry.Job[report]) error {
			if job.Attempt == 1 {
				<-ctx.Done() // a slow first attempt: cancelled at 300 ms
				return ctx.Err()
			}
			printf("report %d built on attempt %d", job.Args.ID, job.Attempt)
			close(built)
			return nil
		}, ferry.WithTimeout(300*time.Millisecond), ferry.WithMaxAttempts(3), ferry.WithRetryDelays(time.Second))
		if err != nil {
			return err
		}
		if err := ferry.Handle(mux, "mail.send", func(ctx context.Context, tx pgx.Tx, job *ferry.Job[mail]) error {
			return errors.New("smtp: 550 mailbox unavailable")
		}, ferry.WithMaxAttempts(1)); err != nil {
			return err
		}
		dead := make(chan struct{})
		run, err := runPipeline(ctx, pool, b, mux, worker.Config{
			OnFailure: func(_ context.Context, _ pgx.Tx, msg *broker.Message, err error, isDead bool) error {
				printf("%s attempt %d failed (dead: %v): %v", msg.Type, msg.Attempt, isDead, err)
				if isDead {
					close(dead)
				}
				return nil
			},
		})
		if err != nil {
			return err
		}
		defer run()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := ferry.Enqueue(ctx, tx, "report.build", report{ID: 7}); err != nil {
				return err
			}
			_, err := ferry.Enqueue(ctx, tx, "mail.send", mail{To: "ada@example.com"})
			return err
		}); err != nil {
			return err
		}
		return waitAll(ctx, built, dead)
	})
	if err != nil {
		fmt.Println(err)
	}
	fmt.Print(out)
	// Output:
	// mail.send attempt 1 failed (dead: true): smtp: 550 mailbox unavailable
	// report 7 built on attempt 2
	// report.build attempt 1 failed (dead: false): worker: handler timed out after 300ms: context deadline exceeded
}

// Middleware around every handler of the Mux: the first Use is the
// outermost, so Logging sees what Recover made of a panic (a failed
// attempt, whose stack Recover logged), and the worker retries it.
// Runs on every broker the ferry command wires, against the real servers.
func ExampleMux_Use() {
	out, err := onEveryBroker(func(ctx context.Context, name string, pool *pgxpool.Pool, b broker.Broker, printf func(string, ...any)) error {
		var logs lockedBuffer
		logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			switch a.Key {
			case slog.TimeKey, "duration", "message_id":
				return slog.Attr{} // they vary from run to run
			case "stack":
				return slog.String("stack", "…")
			}
			return a
		}}))
		mux := ferry.NewMux()
		mux.Use(ferry.Logging(logger), ferry.Recover(logger), ferry.Timeout(10*time.Second))
		done := make(chan struct{})
		err := ferry.Handle(mux, "order.placed", func(ctx context.Context, tx pgx.Tx, job *ferry.Job[OrderPlaced]) error {
			if job.Attempt == 1 {
				var seen map[int64]bool
				seen[job.Args.OrderID] = true // a bug: panics
			}
			close(done)
			return nil
		})
		if err != nil {
			return err
		}
		run, err := runPipeline(ctx, pool, b, mux, worker.Config{})
		if err != nil {
			return err
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := ferry.Enqueue(ctx, tx, "order.placed", OrderPlaced{OrderID: 42})
			return err
		}); err != nil {
			return err
		}
		err = waitAll(ctx, done)
		run() // the last log line is written before the handler's return is seen
		for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			printf("%s", line)
		}
		return err
	}, keepOrder)
	if err != nil {
		fmt.Println(err)
	}
	fmt.Print(out)
	// Output:
	// level=ERROR msg="ferry: handler panicked" type=order.placed attempt=1 panic="assignment to entry in nil map" stack=…
	// level=WARN msg="ferry: handler failed" type=order.placed attempt=1 err="worker: handler panicked: assignment to entry in nil map"
	// level=INFO msg="ferry: handled" type=order.placed attempt=2
}

// keepOrder tells onEveryBroker not to sort the printed lines.
const keepOrder = true

// onEveryBroker runs f on every broker the ferry command wires, at once,
// each with a fresh database and broker connection, and returns what f
// printed, the same on every broker, or an error naming the broker that
// printed something else. Lines are sorted unless keepOrder.
func onEveryBroker(f func(ctx context.Context, name string, pool *pgxpool.Pool, b broker.Broker, printf func(string, ...any)) error, keep ...bool) (string, error) {
	names := ferrycli.BrokerNames()
	outs := make([]string, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() {
			var (
				mu    sync.Mutex
				lines []string
			)
			printf := func(format string, args ...any) {
				mu.Lock()
				defer mu.Unlock()
				lines = append(lines, fmt.Sprintf(format, args...))
			}
			errs[i] = withBroker(name, func(ctx context.Context, pool *pgxpool.Pool, b broker.Broker) error {
				return f(ctx, name, pool, b, printf)
			})
			mu.Lock()
			defer mu.Unlock()
			if len(keep) == 0 || !keep[0] {
				slices.Sort(lines)
			}
			var buf bytes.Buffer
			for _, l := range lines {
				buf.WriteString(l + "\n")
			}
			outs[i] = buf.String()
		})
	}
	wg.Wait()
	for i, name := range names {
		if errs[i] != nil {
			return outs[0], fmt.Errorf("%s: %w", name, errs[i])
		}
		if outs[i] != outs[0] {
			return outs[0], fmt.Errorf("%s printed:\n%s", name, outs[i])
		}
	}
	return outs[0], nil
}

// withBroker runs f with a fresh migrated database and a connection to
// broker name.
func withBroker(name string, f func(ctx context.Context, pool *pgxpool.Pool, b broker.Broker) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn, drop, err := testenv.ExampleDatabase(ctx)
	if err != nil {
		return err
	}
	defer drop()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool); err != nil {
		return err
	}
	b, err := exampleBroker(ctx, name)
	if err != nil {
		return err
	}
	defer b.Close()
	return f(ctx, pool, b)
}

// runPipeline starts a relay and a worker whose Router is mux, on a
// queue bound to mux's patterns, and returns a function that stops them.
func runPipeline(ctx context.Context, pool *pgxpool.Pool, b broker.Broker, mux *ferry.Mux, wc worker.Config) (stop func(), err error) {
	ex := testenv.UniqueName("example")
	wc.Queue, wc.Router = ex+".jobs", mux
	p, err := ferry.New(ferry.Config{
		Pool: pool, Broker: b,
		Topology: broker.Topology{Exchange: ex, Queues: []broker.Queue{
			{Name: wc.Queue, Bindings: mux.Patterns(), RetryDelays: []time.Duration{time.Second}},
		}},
		Relay:   &outbox.RelayConfig{},
		Workers: []worker.Config{wc},
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = p.Run(rctx); close(done) }()
	var once sync.Once
	return func() { once.Do(func() { cancel(); <-done }) }, nil
}

// waitAll waits until every channel is closed, or ctx is done.
func waitAll(ctx context.Context, chs ...chan struct{}) error {
	for _, ch := range chs {
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
