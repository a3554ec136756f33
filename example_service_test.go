package ferry_test

import (
	"context"
	"errors"
	"fmt"
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

// README: begin (the README's "Use ferry in your service" shows this code verbatim)

// OrderPlaced is your event; its JSON form is the message body.
type OrderPlaced struct {
	OrderID int64  `json:"order_id"`
	Email   string `json:"email"`
}

// migrate creates ferry's tables (outbox, processed_messages,
// worker_attempts) and yours.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := outbox.Migrate(ctx, pool); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (
		id BIGINT PRIMARY KEY, email TEXT NOT NULL, confirmed BOOLEAN NOT NULL DEFAULT false)`)
	return err
}

// placeOrder writes the order and its event in one transaction: the event
// is published if and only if the order commits.
func placeOrder(ctx context.Context, pool *pgxpool.Pool, id int64, email string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, email) VALUES ($1, $2)`, id, email); err != nil {
			return err
		}
		_, err := ferry.Enqueue(ctx, tx, "order.placed", OrderPlaced{OrderID: id, Email: email},
			ferry.WithKey(email)) // add ferry.DueIn(time.Hour) to publish it an hour from now
		return err
	})
}

// serve publishes the outbox to the broker and handles the order events
// until ctx is done. exchange names your topology, e.g. "shop".
func serve(ctx context.Context, pool *pgxpool.Pool, b broker.Broker, exchange string) error {
	mux := ferry.NewMux()
	err := ferry.Handle(mux, "order.placed", func(ctx context.Context, tx pgx.Tx, job *ferry.Job[OrderPlaced]) error {
		// Runs in a transaction that commits with ferry's dedup row: once
		// per message, even when the broker delivers it twice.
		_, err := tx.Exec(ctx, `UPDATE orders SET confirmed = true WHERE id = $1`, job.Args.OrderID)
		return err // nil: ack; an error: retried, then the DLQ; worker.Permanent(err): the DLQ now
	})
	if err != nil {
		return err
	}
	queue := exchange + ".orders"
	p, err := ferry.New(ferry.Config{
		Pool:   pool,
		Broker: b,
		Topology: broker.Topology{Exchange: exchange, Queues: []broker.Queue{
			{Name: queue, Bindings: mux.Patterns(), RetryDelays: []time.Duration{time.Second, 30 * time.Second}},
		}},
		Relay:   &outbox.RelayConfig{},                                       // publish the outbox in this process
		Workers: []worker.Config{{Queue: queue, Handler: mux.HandleMessage}}, // and handle the queue
	})
	if err != nil {
		return err
	}
	return p.Run(ctx)
}

// README: end

// Example runs the README's code on every broker the ferry command
// wires (ferrycli.Brokers), against the real servers of
// compose/local/services.sh, each on a fresh database.
func Example() {
	failed := false
	for _, name := range ferrycli.BrokerNames() {
		if err := exampleOn(name); err != nil {
			fmt.Printf("%s: %v\n", name, err)
			failed = true
		}
	}
	if !failed {
		fmt.Println("order 42 confirmed on every broker")
	}
	// Output: order 42 confirmed on every broker
}

func exampleOn(name string) (err error) {
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
	b, err := exampleBroker(ctx, name)
	if err != nil {
		return err
	}
	defer b.Close()

	if err := migrate(ctx, pool); err != nil {
		return err
	}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- serve(sctx, pool, b, testenv.UniqueName("shop")) }()
	defer func() {
		stop()
		if serr := <-done; serr != nil && err == nil {
			err = serr
		}
	}()
	if err := placeOrder(ctx, pool, 42, "ada@example.com"); err != nil {
		return err
	}
	for {
		var confirmed bool
		if err := pool.QueryRow(ctx, `SELECT confirmed FROM orders WHERE id = 42`).Scan(&confirmed); err != nil {
			return err
		}
		if confirmed {
			return nil
		}
		select {
		case err := <-done:
			return fmt.Errorf("serve returned before the order was confirmed: %v", err)
		case <-ctx.Done():
			return errors.New("order 42 not confirmed within a minute")
		case <-time.After(20 * time.Millisecond):
		}
	}
}
