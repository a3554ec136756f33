// Package alert is ferry's built-in "stuck outbox" alert.
//
// An Alert polls a Source (the number of unprocessed outbox rows and the age
// of the oldest one) every Config.Interval. When the count stays above
// Config.Threshold for Config.For it fires: it logs at ERROR and sends one
// notification to every Notifier. When the count falls back to the threshold
// or below it resolves: it logs and sends one more notification. Nothing is
// sent on the ticks in between, so a receiver gets exactly one "firing" and
// one "resolved" message per incident.
//
// The rule is the same as the Prometheus alerting rule FerryOutboxStuck in
// compose/prometheus/alerts.yml (`ferry_outbox_unprocessed_rows > 100` for
// 5m), so a deployment without Prometheus still gets paged, and one with
// Prometheus gets the same answer from both.
//
// States follow Prometheus: Inactive -> Pending (above the threshold, For not
// yet elapsed) -> Firing. Falling to or below the threshold from Pending goes
// back to Inactive silently; from Firing it sends "resolved". A Source error
// leaves the state unchanged (an unreachable database neither fires nor
// resolves the alert) and is logged.
//
// Delivery is at-least-once per notifier and never blocks the state machine:
// a failed notification is logged at ERROR and retried on the next tick, in
// order, for that notifier only. A notifier that keeps failing holds at most
// MaxQueued notifications; older ones are dropped with an ERROR log.
//
// Notifiers: NewWebhook posts the Notification as JSON to any URL; NewTelegram
// calls the Telegram Bot API's sendMessage. Both can be pointed at a local
// HTTP server in tests.
package alert
