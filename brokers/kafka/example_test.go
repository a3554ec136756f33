package kafka_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/kafka"
)

// Connect, declare a topology (the topic "orders", a consumer group
// "orders.billing" with a retry topic and a DLQ topic), publish with
// acks=all, and consume with per-key order.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := kafka.New(ctx, kafka.Config{Brokers: []string{"127.0.0.1:9092"}})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	tp := broker.Topology{Exchange: "orders", Queues: []broker.Queue{
		{Name: "orders.billing", Bindings: []string{"order.*"}, RetryDelays: []time.Duration{10 * time.Second}},
	}}
	if err := b.Declare(ctx, tp); err != nil {
		log.Fatal(err)
	}
	err = b.Publish(ctx, []*broker.Message{{ID: "1", Type: "order.created", Key: "customer-7", Body: []byte(`{}`)}})
	if err != nil {
		log.Fatal(err)
	}
	sub, err := b.Subscribe(ctx, "orders.billing", broker.SubscribeOptions{Prefetch: 20, Ordered: true})
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()
	d, err := sub.Receive(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(d.Message().ID, d.Message().Type)
	if err := d.Ack(ctx); err != nil {
		log.Fatal(err)
	}
}
