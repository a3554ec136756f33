// Package watermill is the peer ferry's benchmarks are measured against:
// the same end-to-end and steady-latency workloads as bench's
// BenchmarkEndToEnd and BenchmarkLatency, built with Watermill's
// documented transactional outbox instead of ferry, on each of ferry's
// brokers with Watermill's own Pub/Sub for it: watermill-amqp on
// RabbitMQ, watermill-kafka on Kafka, watermill-nats (JetStream mode)
// on NATS JetStream, watermill-aws's sqs on SQS (ElasticMQ here).
//
// Producers commit a business row and publish the event through
// watermill-sql's publisher on the same transaction, wrapped by
// components/forwarder's publisher; the forwarder (a watermill-sql
// subscriber polling the forwarder table) publishes each event with the
// broker's Pub/Sub; consumers (the Pub/Sub's subscriptions, a goroutine
// per message as Watermill's Router runs them) deduplicate by message
// UUID in the processed_messages table and update the business row in
// one transaction, then ack. Each broker runs in two profiles, its
// defaults and tuned; pubsubs_test.go says what each sets and why.
//
// It is a module of its own, so ferry's go.mod never depends on Watermill.
// Everything is in _test.go files; run it with
//
//	cd bench/watermill && go test -run '^$' -bench . -benchtime 1x
//	go test -run '^$' -bench 'EndToEnd/kafka/tuned' -benchtime 1x   # one broker and profile
//
// against the servers of compose/local/services.sh (FERRY_DATABASE_URL,
// FERRY_RABBITMQ_URL, FERRY_KAFKA_BROKERS, FERRY_NATS_URL,
// FERRY_SQS_ENDPOINT). See ../README.md.
package watermill
