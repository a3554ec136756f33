package ferry_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// A password reset overtakes a backlog of newsletters: the queue has two
// priority levels (broker.Queue.Priorities), the reset is enqueued
// WithPriority(1) after the newsletters, and the worker takes the higher
// level first. The first job holds the worker's only handler while the
// rest is published, as a busy worker would. Runs on every broker the
// ferry command wires, against the real servers.
func ExampleWithPriority() {
	out, err := onEveryBroker(func(ctx context.Context, name string, pool *pgxpool.Pool, b broker.Broker, printf func(string, ...any)) error {
		mux := ferry.NewMux()
		var (
			mu    sync.Mutex
			order []string
		)
		busy, release, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
		err := ferry.Handle(mux, "mail.#", func(ctx context.Context, tx pgx.Tx, job *ferry.Job[mail]) error {
			if job.Type == "mail.busy" {
				close(busy)
				<-release
				return nil
			}
			mu.Lock()
			defer mu.Unlock()
			if order = append(order, job.Type); len(order) == 4 {
				close(done)
			}
			return nil
		})
		if err != nil {
			return err
		}
		ex := testenv.UniqueName("example")
		p, err := ferry.New(ferry.Config{
			Pool: pool, Broker: b,
			Topology: broker.Topology{Exchange: ex, Queues: []broker.Queue{
				{Name: ex + ".mail", Bindings: []string{"mail.#"}, Priorities: 2},
			}},
			Relay:   &outbox.RelayConfig{},
			Workers: []worker.Config{{Queue: ex + ".mail", Router: mux, Concurrency: 1}},
			Logger:  slog.New(slog.DiscardHandler),
		})
		if err != nil {
			return err
		}
		rctx, stop := context.WithCancel(ctx)
		defer stop()
		go func() { _ = p.Run(rctx) }()
		enqueue := func(typ string, prio int) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := ferry.Enqueue(ctx, tx, typ, mail{To: "ada@example.com"}, ferry.WithPriority(prio))
				return err
			})
		}
		if err := enqueue("mail.busy", 1); err != nil {
			return err
		}
		if err := waitAll(ctx, busy); err != nil {
			return err
		}
		for range 3 {
			if err := enqueue("mail.newsletter", 0); err != nil {
				return err
			}
		}
		if err := enqueue("mail.password_reset", 1); err != nil {
			return err
		}
		time.Sleep(2 * time.Second) // published and fetched meanwhile
		close(release)
		if err := waitAll(ctx, done); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		printf("first: %s, then %d newsletters", order[0], len(order)-1)
		return nil
	})
	if err != nil {
		fmt.Println(err)
	}
	fmt.Print(out)
	// Output:
	// first: mail.password_reset, then 3 newsletters
}
