// Package console is ferry's web console for the people on call: a page
// that shows the outbox (backlog, age of the oldest pending event,
// scheduled and parked rows, publish and handle rates), the dead-letter
// queues of the work queues on any broker (messages grouped by last
// error), a job's story (enqueued → published → each attempt → handled
// or dead), and the flow-control limits (who holds the concurrency slots,
// the rate limits' state, the messages waiting for a limit), and acts on
// them: retry or drop a parked row, replay or purge dead messages.
//
// New returns an http.Handler; `ferry console` serves it, `ferry run` and
// `ferry demo` serve it next to the API, and a service mounts it on its
// own mux under a path of its choice (Config.Prefix):
//
//	c, err := console.New(console.Config{Pool: pool, Broker: b, Queues: []string{"notifications.send"}, Prefix: "/ops", Token: token})
//	mux.Handle("/ops/", c)
//
// It uses the framework's own operations and nothing else: outbox.ReadStats,
// outbox.ListRows, outbox.RetryParked and DropParked, outbox.JobGet and
// JobGetByAppID, and package dlq over broker.DeadLetterQueue; it imports no
// adapter. The Limits page (and api/limits) reads package worker's
// flow-control tables itself (worker.SlotsTable, worker.RatesTable and the
// snoozes column of worker.AttemptsTable), read-only, in one transaction,
// each query bounded by a LIMIT. Every action writes the same audit line
// as the ferry command's (who, when, what; dlq.Replay, dlq.Purge,
// outbox.AuditParked).
//
// # Pages
//
// The pages are HTML rendered on the server by html/template (its
// contextual escaping renders anything that came from a message — bodies,
// headers, error texts, keys — as text, invalid UTF-8 replaced by U+FFFD),
// with the stylesheet and one small script embedded in the binary: nothing
// is fetched from elsewhere, reading works with JavaScript off, and the
// script only refreshes the overview's figures (GET api/overview, JSON).
// Lists are paged and say how many items there are in all; a count above
// 10,000 outbox rows is the planner's estimate and the page says so
// (outbox.ReadBacklog, outbox.ListRows).
//
// The DLQ pages read a queue's whole DLQ through
// broker.DeadLetterQueue.List (the broker is the record of what is dead)
// and serve that reading for Config.DLQCacheTTL, then serve it while it is
// read again in the background; the page says when it was read, and an
// action or "read again" reads it afresh (and waits for it). The overview
// waits at most 100 ms for a DLQ's first reading: past that it says the
// DLQ is being read, and its live update shows the count once read.
//
// # Safety
//
// Reading needs no token from a loopback client; any other client needs
// the token (Authorization: Bearer, or the cookie the login form sets).
// Every action is a POST after a confirmation page, and needs the token
// (Config.Token; refused with 403 when none is set, 401 when it is missing
// or wrong) and the CSRF token of the form (a double-submit cookie, and a
// cross-site Origin or Sec-Fetch-Site is refused with 403). With
// Config.ReadOnly the pages show no actions and every POST is refused
// with 403. Every answer carries a Content-Security-Policy without inline
// script (default-src 'none'; script, style and images from the console
// itself), frame-ancestors 'none' with X-Frame-Options: DENY,
// X-Content-Type-Options: nosniff and Referrer-Policy: same-origin.
package console
