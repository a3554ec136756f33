package suite

import (
	"slices"
	"testing"

	"github.com/ferrymq/ferry/broker"
)

// TestRoutingTable checks the routing scenario's hand-made expectations
// against ferry's matcher (AMQP 0-9-1 topic rules): a wrong row would
// make the scenario count correct deliveries as misrouted or missing.
func TestRoutingTable(t *testing.T) {
	for _, rt := range routingTypes {
		for _, q := range routingQueues {
			matches := slices.ContainsFunc(q.bindings, func(b string) bool { return broker.MatchRoutingKey(b, rt.typ) })
			if want := slices.Contains(rt.queues, q.suffix); matches != want {
				t.Errorf("type %q, queue %s %v: table says %v, MatchRoutingKey says %v", rt.typ, q.suffix, q.bindings, want, matches)
			}
		}
	}
	// Every queue receives something and no type goes everywhere but "all",
	// so a broker that ignores bindings shows misrouted deliveries.
	for _, q := range routingQueues {
		if !slices.ContainsFunc(routingTypes, func(rt routingType) bool { return slices.Contains(rt.queues, q.suffix) }) {
			t.Errorf("queue %s receives no type", q.suffix)
		}
	}
}

// TestRefusedQueue finds the queue a Declare error names.
func TestRefusedQueue(t *testing.T) {
	err := `broker: unsupported by this broker: nats: queue bench_d5c6cf154d.hash-first: binding "#.created": '#' is only supported as the last word`
	if got := refusedQueue(errString(err)); got != "hash-first" {
		t.Fatalf("refusedQueue = %q, want hash-first", got)
	}
	if got := refusedQueue(errString(`broker: unsupported: binding "order.#" refused`)); got != "hash-last" {
		t.Fatalf("refusedQueue by binding = %q, want hash-last", got)
	}
	if got := refusedQueue(errString("something else")); got != "" {
		t.Fatalf("refusedQueue = %q, want none", got)
	}
}

type errString string

func (e errString) Error() string { return string(e) }
