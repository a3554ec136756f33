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

type orderStep struct {
	OrderID string `json:"order_id"`
}

// fulfil is the code docs/library.md's "Workflows" shows: charge, then
// pack and invoice (fan-out), then ship once both are done (fan-in).
//
// README: workflow begin
func fulfil(ctx context.Context, tx pgx.Tx, orderID string) (int64, error) {
	wf := ferry.NewWorkflow("order.fulfil")
	o := orderStep{OrderID: orderID}
	charge := ferry.AddJob(wf, "order.charge", o, ferry.WithAppID(orderID))
	pack := ferry.AddJob(wf, "order.pack", o, ferry.After(charge))
	invoice := ferry.AddJob(wf, "order.invoice", o, ferry.After(charge))
	ferry.AddJob(wf, "order.ship", o, ferry.After(pack, invoice))
	id, _, err := ferry.EnqueueWorkflow(ctx, tx, wf) // nothing stored on a cycle
	return id, err
}

// README: workflow end

// ExampleEnqueueWorkflow enqueues the workflow of fulfil in one
// transaction and runs a relay and a worker (one handler at a time, so
// the order printed is fixed): ship is published only after pack and
// invoice were handled, which waited for charge. Then it reads the
// workflow as one unit. Runs against the real PostgreSQL and RabbitMQ.
func ExampleEnqueueWorkflow() {
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

	handled := make(chan string, 4)
	mux := ferry.NewMux()
	_ = ferry.Handle(mux, "order.*", func(ctx context.Context, tx pgx.Tx, job *ferry.Job[orderStep]) error {
		handled <- job.Type
		return nil
	})
	exchange := testenv.UniqueName("shop")
	p, err := ferry.New(ferry.Config{
		Pool: pool, Broker: b,
		Topology: broker.Topology{Exchange: exchange, Queues: []broker.Queue{{Name: exchange + ".orders", Bindings: []string{"order.*"}}}},
		Relay:    &outbox.RelayConfig{},
		Workers:  []worker.Config{{Queue: exchange + ".orders", Handler: mux.HandleMessage, Concurrency: 1}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(rctx) }()
	defer func() { stop(); <-done }()
	var id int64
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		id, err = fulfil(ctx, tx, "order-7")
		return err
	}); err != nil {
		fmt.Println(err)
		return
	}
	for range 4 {
		fmt.Println("handled", <-handled)
	}
	// The handler sent before its transaction committed: wait for the
	// commit of ship's, which settles it.
	var wf outbox.WorkflowInfo
	for wf.Done < 4 && ctx.Err() == nil {
		if wf, err = outbox.WorkflowGet(ctx, pool, id); err != nil {
			fmt.Println(err)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println(wf.Name, len(wf.Jobs), "jobs,", wf.Done, "completed; ship waited for", len(wf.Jobs[3].After))
	// Output:
	// handled order.charge
	// handled order.pack
	// handled order.invoice
	// handled order.ship
	// order.fulfil 4 jobs, 4 completed; ship waited for 2
}
