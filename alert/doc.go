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
// # One alert per database
//
// Without Config.Pool the state lives in the process: every relay replica
// with an Alert notifies on its own (two replicas, two "firing" messages),
// and a replica stopped while firing never sends "resolved".
//
// With Config.Pool the alert is one per database. The Alerts of all
// processes elect a leader with a PostgreSQL session-level advisory lock,
// pg_try_advisory_lock(LockClassID, LockObjID(Name)), tried every Interval
// by each non-leader on a pool connection; the winner takes that connection
// out of the pool and holds it while it leads. Only the leader reads the
// Source and notifies. The leader checks the connection on every tick; when
// it fails (or a query on it fails) the leadership is lost, the in-memory
// state is forgotten, and whoever takes the lock next continues from the
// table. Close (and Run on return) releases the lock. The leader's session
// sets idle_session_timeout (at least a minute, well above the time between
// its pings), so a leader whose host vanished without closing the
// connection loses the lock then, not when TCP keepalive gives up.
//
// The state is kept in the table ferry_alerts (TableName), created with
// CREATE TABLE IF NOT EXISTS by the first leader: state, since (when the
// backlog first went above the threshold), fired_at, resolved_at and the
// undelivered notifications of each notifier. A new leader therefore
// continues the incident: a stored "firing" whose backlog is now under the
// threshold sends "resolved" once; a stored "pending" keeps its since, so
// For is measured from when the backlog first exceeded the threshold, not
// from the new leader's start — but only when a leader observed the
// backlog recently. While pending or firing the leader records each
// observation (checked_at, written every Interval); a stored "pending"
// last checked longer ago than the leader lock's idle timeout plus two
// Intervals (at least a minute; the longest a healthy handover takes) is
// stale: nobody watched the backlog in between, so the new leader drops it
// and re-evaluates from now (a WARN says so), and For starts again.
//
// Ordering: after a transition the leader saves the new state together with
// the notifications it is about to send, then sends, then saves again with
// the delivered ones removed. A leader that dies before sending leaves the
// notifications to its successor (none is lost); one that dies after
// sending but before the second save makes its successor send them again,
// so a receiver may see one notification twice (at-least-once). The writes
// go through the lock's own connection, so they cannot succeed after the
// lock is lost; the HTTP sends are not fenced that way, so a leader cut off
// in the middle of a send can also, rarely, duplicate one. Every process
// should be configured with the same notifiers in the same order: queues are
// keyed by the notifier's String(), and a new leader drops (with an ERROR
// log) stored notifications for notifiers it does not have. The For timing
// uses each leader's clock, so replicas' clocks should agree.
//
// Notifiers: NewWebhook posts the Notification as JSON to any URL; NewTelegram
// calls the Telegram Bot API's sendMessage. Both can be pointed at a local
// HTTP server in tests.
package alert
