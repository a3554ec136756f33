package rabbitmq_test

import (
	"context"
	"log"
	"time"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/rabbitmq"
)

// Connect, declare the topology, publish an event with confirms, and
// handle it once: ack on success, retry after a delay on failure.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := rabbitmq.New(ctx, rabbitmq.Config{URL: "amqp://guest:guest@127.0.0.1:5672/"})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	topo := broker.Topology{Exchange: "notifications", Queues: []broker.Queue{{
		Name:        "notifications.send",
		Bindings:    []string{"notification.*"},
		RetryDelays: []time.Duration{time.Second, 10 * time.Second, time.Minute},
	}}}
	if err := b.Declare(ctx, topo); err != nil { // every process, at start
		log.Fatal(err)
	}
	err = b.Publish(ctx, []*broker.Message{{ID: "1", Type: "notification.requested", Key: "user-42", Body: []byte(`{}`)}})
	if err != nil {
		log.Fatal(err) // a *broker.PublishError says which messages failed
	}

	sub, err := b.Subscribe(ctx, "notifications.send", broker.SubscribeOptions{Prefetch: 10})
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()
	d, err := sub.Receive(ctx)
	if err != nil {
		log.Fatal(err)
	}
	if err := handle(d.Message()); err != nil {
		// Back to notifications.send only, after the 1s level.
		_ = d.Retry(ctx, time.Second, err.Error())
		return
	}
	_ = d.Ack(ctx)
}

func handle(*broker.Message) error { return nil }
