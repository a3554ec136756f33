package outbox_test

import (
	"context"
	"log"
	"os"
	"os/signal"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/outbox"
)

// The application writes its own rows and the event in one transaction.
func ExampleEnqueue() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("FERRY_DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... INSERT INTO notifications ... in the same tx ...
		ids, err := outbox.Enqueue(ctx, tx, outbox.Event{
			Type:    "notification.requested",
			Key:     "user-42",
			Body:    []byte(`{"notification_id":"n-1"}`),
			Headers: map[string]string{broker.HeaderTraceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		})
		if err != nil {
			return err
		}
		log.Printf("enqueued as message %d", ids[0])
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// The relay runs until the process is interrupted. The broker (here any
// broker.Broker) must have the topology declared.
func ExampleRelay_Run() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("FERRY_DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	var b broker.Broker // e.g. rabbitmq.New(ctx, rabbitmq.Config{URL: ...}), then b.Declare(ctx, topology)
	relay, err := outbox.NewRelay(outbox.RelayConfig{
		Pool:   pool,
		Broker: b,
		OnBatch: func(s outbox.BatchStats) {
			log.Printf("published %d, failed %d in %v", s.Published, s.Failed, s.Duration)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
