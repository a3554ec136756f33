// Package metrics defines ferry's Prometheus metrics and serves them at
// GET /metrics on every role (api, relay, worker, run).
//
// Every metric carries a constant label broker="<name>" (the adapter in use,
// e.g. "rabbitmq", "nats"; "none" for ferry api, which uses no broker), and
// every name ends with its unit:
//
//	ferry_outbox_unprocessed_rows                  gauge      rows not yet published
//	ferry_outbox_oldest_unprocessed_age_seconds    gauge      age of the oldest of them
//	ferry_outbox_parked_rows                       gauge      of them, rows the broker refused for a reason
//	                                                          of their own, retried with backoff (with an
//	                                                          OutboxStatsFunc: NewOutboxStatsCollector)
//	ferry_relay_published_total                    counter    rows published (broker-confirmed)
//	ferry_relay_publish_errors_total               counter    rows whose publication failed
//	ferry_relay_batch_duration_seconds             histogram  one relay batch, claim to commit
//	ferry_relay_blocked{reason}                    gauge      1 while the broker has no room and the relay
//	                                                          holds its rows, reason the broker's words
//	                                                          (SetRelayBlocked); reason="" 0 otherwise
//	ferry_worker_messages_total{outcome}           counter    deliveries settled, by outcome:
//	                                                          ack, retry, dead, duplicate, snoozed
//	                                                          (what the broker took), unsettled
//	                                                          (what it did not)
//	ferry_worker_handler_duration_seconds          histogram  one handling attempt
//	ferry_worker_end_to_end_latency_seconds        histogram  outbox row created -> handled
//	ferry_worker_settle_failures_total{op,reason}  counter    settlements the broker did not take:
//	                                                          op ack, retry, dead_letter, extend;
//	                                                          reason broker.SettleReason's
//	ferry_queue_messages{queue}                    gauge      messages waiting in the queue (Kafka: lag)
//	ferry_queue_oldest_message_age_seconds{queue}  gauge      age of the oldest of them (0: none, or SQS)
//	ferry_queue_retention_seconds{queue}           gauge      age at which the broker deletes them, read or not (0: never)
//
// The three queue gauges are read from the broker at scrape time by a
// QueueCollector, on the worker's process, for the brokers that report a
// backlog (broker.BacklogReporter: Kafka, NATS, SQS). They exist for the
// deletions no DLQ sees (Kafka retention.ms, a JetStream MaxAge, SQS's
// retention): the rule FerryQueueNearRetention fires when the oldest
// message is past half the retention. RabbitMQ dead-letters what it drops
// to the queue's DLQ instead (package rabbitmq).
//
// The outbox gauges are read from the database at scrape time by an
// OutboxCollector (with a short timeout), so they are right on every
// replica, even one whose relay is idle, and cost nothing between scrapes.
// The relay and worker series are fed by the hooks of those packages:
// outbox.RelayConfig.OnBatch calls ObserveBatch, OnBlocked
// SetRelayBlocked, worker.Config.OnOutcome
// calls ObserveOutcome and worker.Config.OnSettleFailure calls
// ObserveSettleFailure (a failed Ack counts there and as outcome
// unsettled, never as ack). A nil *Metrics accepts every call and records
// nothing, so wiring code need not test for "metrics off".
//
// The end-to-end latency is measured from the broker.HeaderCreatedAt header
// (the commit time of the outbox row, set by the relay) to the moment the
// worker acked the message; it includes relay lag, broker time, queueing
// and retries, and depends on the clocks of the database and the worker
// host agreeing.
package metrics
