package ferry_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

type welcome struct {
	UserID string `json:"user_id"`
}

// ExampleUnique enqueues the welcome email of one user twice within its
// window (24 hours): the second Enqueue stores nothing and returns the
// first event's id, also when the two run in concurrent transactions.
// Runs against the PostgreSQL of compose/local/services.sh.
func ExampleUnique() {
	ctx := context.Background()
	dsn, drop, err := testenv.ExampleDatabase(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drop()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool); err != nil {
		fmt.Println(err)
		return
	}
	send := func() (id int64, err error) {
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			id, err = ferry.Enqueue(ctx, tx, "email.welcome", welcome{UserID: "u42"},
				ferry.Unique("email.welcome:u42", 24*time.Hour))
			return err
		})
		return id, err
	}
	first, err1 := send()
	second, err2 := send()
	var rows int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&rows)
	fmt.Println(err1, err2, first == second, rows)
	// Output: <nil> <nil> true 1
}

// ExampleWithDestination runs the relay and worker of a "billing" service
// that shares its database with other services: its pipeline's
// Destination is "billing", so its relay publishes the event enqueued
// WithDestination("billing") and leaves alone the one enqueued for the
// default destination, which another service's relay publishes to its
// own exchange. Runs against the real PostgreSQL and RabbitMQ.
func ExampleWithDestination() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn, drop, err := testenv.ExampleDatabase(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drop()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	b, err := exampleBroker(ctx, "rabbitmq")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()
	if err := outbox.Migrate(ctx, pool); err != nil {
		fmt.Println(err)
		return
	}

	handled := make(chan string, 2)
	mux := ferry.NewMux()
	_ = ferry.Handle(mux, "invoice.due", func(ctx context.Context, tx pgx.Tx, job *ferry.Job[welcome]) error {
		handled <- job.Args.UserID
		return nil
	})
	exchange := testenv.UniqueName("billing")
	p, err := ferry.New(ferry.Config{
		Pool: pool, Broker: b,
		Topology:    broker.Topology{Exchange: exchange, Queues: []broker.Queue{{Name: exchange + ".invoices", Bindings: mux.Patterns()}}},
		Destination: "billing", // this relay claims only the "billing" events
		Relay:       &outbox.RelayConfig{},
		Workers:     []worker.Config{{Queue: exchange + ".invoices", Handler: mux.HandleMessage}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(rctx) }()
	_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := ferry.Enqueue(ctx, tx, "invoice.due", welcome{UserID: "mine"}, ferry.WithDestination("billing")); err != nil {
			return err
		}
		_, err := ferry.Enqueue(ctx, tx, "invoice.due", welcome{UserID: "another service's"})
		return err
	})
	fmt.Println("handled:", <-handled)
	time.Sleep(time.Second)
	stop()
	<-done
	var dest string
	_ = pool.QueryRow(ctx, `SELECT destination FROM outbox WHERE processed_at IS NULL`).Scan(&dest)
	fmt.Println("still waiting for its own relay:", dest, len(handled))
	// Output:
	// handled: mine
	// still waiting for its own relay: default 0
}

// ExampleEnqueueMany stores the welcome emails of three users in one
// INSERT inside the caller's transaction: they are published if and only
// if it commits, and the ids come back in the order of the args.
// Runs against the PostgreSQL of compose/local/services.sh.
func ExampleEnqueueMany() {
	ctx := context.Background()
	dsn, drop, err := testenv.ExampleDatabase(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drop()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool); err != nil {
		fmt.Println(err)
		return
	}
	users := []welcome{{UserID: "u1"}, {UserID: "u2"}, {UserID: "u3"}}
	var ids []int64
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		ids, err = ferry.EnqueueMany(ctx, tx, "email.welcome", users)
		return err
	})
	var rows int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE event_type = 'email.welcome'`).Scan(&rows)
	fmt.Println(err, len(ids), ids[0] < ids[1] && ids[1] < ids[2], rows)
	// Output: <nil> 3 true 3
}
