// Package watermill is the peer ferry's benchmarks are measured against:
// the same end-to-end and steady-latency workloads as bench's
// BenchmarkEndToEnd and BenchmarkLatency, built with Watermill's
// documented transactional outbox instead of ferry. Producers commit a
// business row and publish the event through watermill-sql's publisher on
// the same transaction, wrapped by components/forwarder's publisher; the
// forwarder (a watermill-sql subscriber polling the forwarder table)
// publishes each event to RabbitMQ with watermill-amqp; consumers
// (watermill-amqp subscriptions) deduplicate by message UUID in the
// processed_messages table and update the business row in one transaction,
// then ack.
//
// It is a module of its own, so ferry's go.mod never depends on Watermill.
// Everything is in _test.go files; run it with
//
//	cd bench/watermill && go test -run '^$' -bench . -benchtime 1x
//
// against the servers of compose/local/services.sh. See ../README.md.
package watermill
