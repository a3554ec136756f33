// Package metrics defines ferry's Prometheus metrics and serves them at
// GET /metrics on every role (api, relay, worker, run).
//
// Every metric carries a constant label broker="<name>" (the adapter in use,
// e.g. "rabbitmq", "nats"; "none" for ferry api, which uses no broker), and
// every name ends with its unit:
//
//	ferry_outbox_unprocessed_rows                  gauge      rows not yet published
//	ferry_outbox_oldest_unprocessed_age_seconds    gauge      age of the oldest of them
//	ferry_relay_published_total                    counter    rows published (broker-confirmed)
//	ferry_relay_publish_errors_total               counter    rows whose publication failed
//	ferry_relay_batch_duration_seconds             histogram  one relay batch, claim to commit
//	ferry_worker_messages_total{outcome}           counter    deliveries settled, by outcome:
//	                                                          ack, retry, dead, duplicate
//	ferry_worker_handler_duration_seconds          histogram  one handling attempt
//	ferry_worker_end_to_end_latency_seconds        histogram  outbox row created -> handled
//
// The two outbox gauges are read from the database at scrape time by an
// OutboxCollector (with a short timeout), so they are right on every
// replica, even one whose relay is idle, and cost nothing between scrapes.
// The relay and worker series are fed by the hooks of those packages:
// outbox.RelayConfig.OnBatch calls ObserveBatch and worker.Config.OnOutcome
// calls ObserveOutcome. A nil *Metrics accepts every call and records
// nothing, so wiring code need not test for "metrics off".
//
// The end-to-end latency is measured from the broker.HeaderCreatedAt header
// (the commit time of the outbox row, set by the relay) to the moment the
// worker acked the message; it includes relay lag, broker time, queueing
// and retries, and depends on the clocks of the database and the worker
// host agreeing.
package metrics
