package worker_test

import (
	"context"
	"errors"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/rabbitmq"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// A worker that marks notifications sent, once per notification whatever
// the number of deliveries, and stops cleanly on SIGTERM.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	pool, err := pgxpool.New(ctx, "postgres://ferry:ferry@127.0.0.1:5432/ferry?pool_max_conns=20")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool); err != nil { // creates processed_messages
		log.Fatal(err)
	}
	b, err := rabbitmq.New(ctx, rabbitmq.Config{URL: "amqp://guest:guest@127.0.0.1:5672/"})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	delays := []time.Duration{time.Second, 10 * time.Second, time.Minute}
	w, err := worker.New(worker.Config{
		Consumer: "mailer",
		Queue:    "notifications.send",
		Pool:     pool,
		Broker:   b,
		Topology: broker.Topology{
			Exchange: "notifications",
			Queues:   []broker.Queue{{Name: "notifications.send", Bindings: []string{"notification.requested"}, RetryDelays: delays}},
		},
		Policy: worker.BackoffPolicy{MaxAttempts: 5, Delays: delays},
		Handler: func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
			tag, err := tx.Exec(ctx, `UPDATE notifications SET status = 'sent' WHERE id = $1 AND status = 'pending'`, msg.ID)
			if err != nil {
				return err // retried under the policy
			}
			if tag.RowsAffected() == 0 {
				return worker.Permanent(errors.New("no pending notification " + msg.ID)) // straight to the DLQ
			}
			return nil // committed with the dedup row, then acked
		},
		OnFailure: func(ctx context.Context, tx pgx.Tx, msg *broker.Message, err error, dead bool) error {
			if !dead {
				return nil
			}
			_, err = tx.Exec(ctx, `UPDATE notifications SET status = 'failed', last_error = $2 WHERE id = $1`, msg.ID, err.Error())
			return err
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Run(ctx); err != nil { // returns nil after SIGTERM and the in-flight handlers
		log.Fatal(err)
	}
}
