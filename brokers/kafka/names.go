package kafka

import (
	"strconv"

	"github.com/ferrymq/ferry/broker"
)

// Record headers the adapter sets for itself. They never reach
// broker.Message.Headers: ID, Type and Key travel in them, and the retry
// forwarder and the DLQ use the others.
const (
	hdrID        = "x-ferry-id"        // Message.ID
	hdrType      = "x-ferry-type"      // Message.Type (the routing key)
	hdrQueue     = "x-ferry-queue"     // only this queue takes the record (retry, DLQ replay)
	hdrDue       = "x-ferry-due"       // retry topics: Unix ms at which the forwarder writes it back
	hdrTopic     = "x-ferry-topic"     // DLQ: the work topic the message came from
	hdrKey       = "x-ferry-key"       // DLQ: Message.Key (the record key is the ID there)
	hdrTombstone = "x-ferry-tombstone" // DLQ: the ID was replayed or purged
)

// TopicName returns the work topic of an exchange: the exchange's name.
// Every queue bound to the exchange is a consumer group on it.
func TopicName(exchange string) string { return exchange }

// RetryTopicName returns the topic of retry level i (0-based) of queue:
// "<queue>.retry.<i>".
func RetryTopicName(queue string, i int) string { return queue + ".retry." + strconv.Itoa(i) }

// DLQTopicName returns the compacted DLQ topic of queue: "<queue>.dlq"
// (broker.DLQName).
func DLQTopicName(queue string) string { return broker.DLQName(queue) }

// GroupID returns the consumer group of queue: the queue's name.
func GroupID(queue string) string { return queue }

// TopicNames returns every topic Declare creates for t: the work topic,
// then each queue's retry topics and DLQ topic. Tests and operators use it
// to delete a topology.
func TopicNames(t broker.Topology) []string {
	names := []string{TopicName(t.Exchange)}
	for _, q := range t.Queues {
		for i := range q.Delays() {
			names = append(names, RetryTopicName(q.Name, i))
		}
		names = append(names, DLQTopicName(q.Name))
	}
	return names
}
