package ferry_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// README database/sql: begin

// placeOrderSQL is placeOrder for code on database/sql: db is pgx's
// driver over the same database (stdlib.OpenDBFromPool(pool), or
// sql.Open("pgx", url)).
func placeOrderSQL(ctx context.Context, db *sql.DB, id int64, email string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, email) VALUES ($1, $2)`, id, email); err != nil {
		return err
	}
	if _, err := ferry.EnqueueSQL(ctx, tx, "order.placed", OrderPlaced{OrderID: id, Email: email}); err != nil {
		return err
	}
	return tx.Commit()
}

// serveSQL handles the order events with a handler that takes a *sql.Tx:
// its writes commit with ferry's dedup row, or not at all.
func serveSQL(ctx context.Context, pool *pgxpool.Pool, b broker.Broker, exchange string) error {
	mux := ferry.NewMux()
	err := ferry.HandleSQL(mux, "order.placed", func(ctx context.Context, tx *sql.Tx, job *ferry.Job[OrderPlaced]) error {
		_, err := tx.ExecContext(ctx, `UPDATE orders SET confirmed = true WHERE id = $1`, job.Args.OrderID)
		return err
	})
	if err != nil {
		return err
	}
	queue := exchange + ".orders"
	p, err := ferry.New(ferry.Config{
		Pool:     pool, // ferry's relay and worker run on pgx; the handler's *sql.Tx is a connection of this pool
		Broker:   b,
		Topology: broker.Topology{Exchange: exchange, Queues: []broker.Queue{{Name: queue, Bindings: mux.Patterns()}}},
		Relay:    &outbox.RelayConfig{},
		Workers:  []worker.Config{{Queue: queue, SQLHandler: mux.HandleMessageSQL}}, // SQLHandler, not Handler
	})
	if err != nil {
		return err
	}
	return p.Run(ctx)
}

// README database/sql: end

// Example_sqlHandler runs a database/sql service (EnqueueSQL and a
// HandleSQL handler) on NATS against the real servers, on a fresh
// database. TestSQLHandlerCommitsWithDedup runs such a handler on every
// broker.
func Example_sqlHandler() {
	if err := exampleSQLOn("nats"); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("order 7 confirmed through a *sql.Tx")
	// Output: order 7 confirmed through a *sql.Tx
}

func exampleSQLOn(name string) (err error) {
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
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()

	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- serveSQL(sctx, pool, b, testenv.UniqueName("shopsql")) }()
	defer func() {
		stop()
		if serr := <-done; serr != nil && err == nil {
			err = serr
		}
	}()
	if err := placeOrderSQL(ctx, db, 7, "grace@example.com"); err != nil {
		return err
	}
	for {
		var confirmed bool
		if err := db.QueryRowContext(ctx, `SELECT confirmed FROM orders WHERE id = 7`).Scan(&confirmed); err != nil {
			return err
		}
		if confirmed {
			return nil
		}
		select {
		case err := <-done:
			return fmt.Errorf("serveSQL returned before the order was confirmed: %v", err)
		case <-ctx.Done():
			return errors.New("order 7 not confirmed within a minute")
		case <-time.After(20 * time.Millisecond):
		}
	}
}
