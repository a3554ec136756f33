package nats_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/nats"
)

// Declare a topology on a local nats-server with JetStream, publish one
// event and handle it.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := nats.New(ctx, nats.Config{URL: "nats://127.0.0.1:4222"})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	topo := broker.Topology{
		Exchange: "notifications",
		Queues: []broker.Queue{{
			Name:        "notifications.send",
			Bindings:    []string{"notification.#"},
			RetryDelays: []time.Duration{time.Second, 10 * time.Second},
		}},
	}
	if err := b.Declare(ctx, topo); err != nil {
		log.Fatal(err)
	}
	err = b.Publish(ctx, []*broker.Message{{
		ID: "1", Type: "notification.requested", Key: "user-42", Body: []byte(`{"to":"a@example.com"}`),
	}})
	if err != nil {
		log.Fatal(err) // a *broker.PublishError names the failed messages
	}

	sub, err := b.Subscribe(ctx, "notifications.send", broker.SubscribeOptions{Prefetch: 10, AckDeadline: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()
	d, err := sub.Receive(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(d.Message().Type, d.Message().Attempt)
	if err := d.Ack(ctx); err != nil {
		log.Fatal(err)
	}
}
