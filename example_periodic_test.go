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

// README periodic: begin

// Cleanup is a periodic job's args.
type Cleanup struct {
	OlderThanDays int `json:"older_than_days"`
}

// servePeriodic enqueues a "cleanup.run" job every second (a cron
// expression such as "0 3 * * *" works the same) and handles it. Run it in
// every replica: each tick is enqueued once across them, then goes through
// the outbox and the broker like any other event.
func servePeriodic(ctx context.Context, pool *pgxpool.Pool, b broker.Broker, exchange string) error {
	job, err := ferry.Periodic("cleanup", "@every 1s", "cleanup.run", Cleanup{OlderThanDays: 30})
	if err != nil {
		return err
	}
	mux := ferry.NewMux()
	err = ferry.Handle(mux, "cleanup.run", func(ctx context.Context, tx pgx.Tx, j *ferry.Job[Cleanup]) error {
		// j.Headers[broker.HeaderAppID] is "cleanup@<tick>", e.g. "cleanup@2026-12-01T03:00:00Z".
		_, err := tx.Exec(ctx, `INSERT INTO cleanups (tick, older_than_days) VALUES ($1, $2)`,
			j.Headers[broker.HeaderAppID], j.Args.OlderThanDays)
		return err
	})
	if err != nil {
		return err
	}
	queue := exchange + ".maintenance"
	p, err := ferry.New(ferry.Config{
		Pool:     pool,
		Broker:   b,
		Topology: broker.Topology{Exchange: exchange, Queues: []broker.Queue{{Name: queue, Bindings: mux.Patterns()}}},
		Periodic: []*ferry.PeriodicJob{job}, // enqueue at each tick
		Relay:    &outbox.RelayConfig{},
		Workers:  []worker.Config{{Queue: queue, Handler: mux.HandleMessage}},
	})
	if err != nil {
		return err
	}
	return p.Run(ctx)
}

// README periodic: end

// Example_periodic runs a periodic job end to end (scheduler, outbox,
// relay, broker, worker) on every broker the ferry command wires, against
// the real servers, each on a fresh database, until two ticks were
// handled.
func Example_periodic() {
	failed := false
	for _, name := range ferrycli.BrokerNames() {
		if err := examplePeriodicOn(name); err != nil {
			fmt.Printf("%s: %v\n", name, err)
			failed = true
		}
	}
	if !failed {
		fmt.Println("two ticks of cleanup handled on every broker")
	}
	// Output: two ticks of cleanup handled on every broker
}

func examplePeriodicOn(name string) (err error) {
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
	if err := outbox.Migrate(ctx, pool); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE cleanups (tick TEXT PRIMARY KEY, older_than_days INT)`); err != nil {
		return err
	}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- servePeriodic(sctx, pool, b, testenv.UniqueName("maint")) }()
	defer func() {
		stop()
		if serr := <-done; serr != nil && err == nil {
			err = serr
		}
	}()
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM cleanups WHERE older_than_days = 30`).Scan(&n); err != nil {
			return err
		}
		if n >= 2 {
			return nil
		}
		select {
		case err := <-done:
			return fmt.Errorf("servePeriodic returned before two ticks were handled: %v", err)
		case <-ctx.Done():
			return errors.New("two ticks not handled within a minute")
		case <-time.After(20 * time.Millisecond):
		}
	}
}
