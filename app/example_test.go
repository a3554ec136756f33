package app_test

import (
	"context"
	"errors"
	"log"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/app"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// connectBroker stands for the adapter the process chooses, e.g.
// rabbitmq.New(ctx, rabbitmq.Config{URL: ...}); package app never imports
// an adapter.
var connectBroker = func(ctx context.Context) (broker.Broker, error) {
	return nil, errors.New("choose a broker adapter")
}

// Example wires the notification service: migrations, the HTTP API, and
// a ferry pipeline running the outbox relay, which publishes what the API
// commits, and the worker that sends the mail through the service's mux.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://ferry:ferry@127.0.0.1:5432/ferry")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	if err := app.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	svc, err := app.New(app.Config{Pool: pool, SMTPAddr: "127.0.0.1:1025"})
	if err != nil {
		log.Fatal(err)
	}

	// The API process.
	go func() { log.Fatal(http.ListenAndServe("127.0.0.1:8080", svc.Handler())) }()

	// The relay and the worker.
	b, err := connectBroker(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	p, err := ferry.New(ferry.Config{
		Pool:     pool,
		Broker:   b,
		Topology: svc.Topology([]time.Duration{time.Second, 10 * time.Second, time.Minute}),
		Relay:    &outbox.RelayConfig{},
		Workers: []worker.Config{{
			Queue:     svc.Queue(),
			Handler:   svc.Mux().HandleMessage, // the same as svc.HandleNotification
			OnFailure: svc.OnFailure,
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(p.Run(ctx))
}
