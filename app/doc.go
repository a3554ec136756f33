// Package app is ferry's sample application: a notification service that
// accepts requests over HTTP, stores each with its event in one PostgreSQL
// transaction (the transactional outbox), and sends the mail from a worker.
//
// It uses only the framework (packages broker, outbox and worker), never a
// broker adapter: the process that runs it chooses the broker.
//
// # Flow
//
//	POST /notifications --(one tx)--> notifications row + outbox row (notification.requested)
//	outbox relay --> broker exchange "notifications" --> queue "notifications.send"
//	worker --> HandleNotification --> SMTP --> status "sent"
//	         \-> OnFailure after each failed attempt; the last one makes it "dead"
//
// # HTTP API
//
// POST /notifications takes {"user_id", "channel", "to", "subject", "body"}:
// user_id a non-empty string, channel "email" (the only channel built; any
// other is 422 unsupported_channel), to a bare email address, subject
// optional without line breaks, body non-empty and at most
// Config.MaxBodyBytes (64 KiB; more is 413). It answers 201 with
// {"id": "42", "status": "pending"} and a Location header. Ids are
// PostgreSQL bigints rendered as decimal strings everywhere (API, event
// payload, Status), so JavaScript clients never lose precision.
//
// Every error answer is JSON, {"error": "...", "field": "to", "code":
// "invalid_address"}, with one of the Code constants, so rejections can be
// grouped by code; bad input is 400 (undecodable), 413 (too large) or 422
// (decodable but invalid) and writes nothing. The parser guesses nothing:
// a member given twice is 400 duplicate_field (a lenient decoder would keep
// the last "to"); bytes PostgreSQL refuses (U+0000, invalid UTF-8) and
// escapes that encode no character (an unpaired surrogate such as
// "\ud800", which decoders turn into U+FFFD) are caught before the
// database; a Content-Type other than application/json or a
// Content-Encoding other than identity is 415 (no Content-Type is read as
// JSON). A request over the whole-request limit is 413 request_too_large;
// a body field over Config.MaxBodyBytes is 413 body_too_large. A known
// path with another method is 405 with an Allow header, an unknown path
// 404, both in JSON.
//
// An Idempotency-Key header makes the request repeatable: the key and a
// hash of the normalized request are stored with the row under a unique
// constraint, so a repeat (even a concurrent one) writes nothing and gets
// 201 with the same id, the notification's current status (pending, sent
// or dead) and the header Idempotent-Replayed: true; the same key with a
// different request is 422 idempotency_key_reused.
//
// GET /notifications/{id} returns a Notification (status pending, sent or
// dead, attempts, last_error); an unknown id is 404 not_found, and so is
// any id not in canonical decimal form ("01" and "+1" are not 1); while
// the database is down it is 503 unavailable. GET
// /healthz answers while the process runs; GET /readyz is 503 while the
// database does not answer or lacks the schema (see CheckSchema), with a
// reason that never includes the driver's error (that goes to the log).
//
// # Delivery semantics
//
// An accepted notification's event is committed with it, so the relay
// publishes it at least once; a request that fails writes neither.
// HandleNotification runs in the worker's deduplication transaction and
// locks the notification row, so concurrent duplicates serialize and the
// second skips a notification already sent. It marks the row sent before
// it talks to the SMTP server, in that transaction, which commits only if
// the send succeeded; so once the SMTP server has accepted the mail, only
// the worker's COMMIT remains.
//
// A worker shutting down lets the handler run for up to its
// ShutdownTimeout (--shutdown-timeout) and only then cancels the
// handler's ctx. The cancel cuts the SMTP dialogue at once (the
// connection is closed), except while the server is answering a mail it
// has received in full: closing then would leave the outcome unknown, so
// the handler waits for the answer and reports an accepted mail as sent.
// That wait is bounded by the process, not by Config.SMTPDataTimeout: the
// worker gives cancelled handlers worker.ShutdownGrace (2 s) and the
// ferry process exits at most ferrycli.ShutdownMargin (5 s) after the
// timeout, which closes the connection. A reply that comes later is lost
// with it: the transaction rolls back, the broker redelivers the event,
// and the mail may be sent twice (same Message-ID; see below). Setting
// --shutdown-timeout above the mail server's usual answer time keeps that
// rare.
//
// An SMTP 5xx answer at any step of the dialogue — the greeting, EHLO
// and HELO, MAIL, RCPT, the end of the data — is permanent (RFC 5321
// section 4.2.1): the message goes to the DLQ at once and the
// notification becomes dead. A 4xx answer (421 at the greeting: service
// not available) and network errors are retried under the worker's
// policy.
//
// Commands get Config.SMTPTimeout (10 s), but the reply to the end of the
// data gets Config.SMTPDataTimeout (10 minutes, RFC 5321 section
// 4.5.3.2.6): a server may scan the mail before it answers, and giving up
// early is what turns one mail into several (the server accepted it, the
// handler saw a timeout, each retry sent it again).
//
// That leaves one window that no framework can close without the mail
// server's cooperation (SMTP has no two-phase commit): a crash (kill -9,
// power loss, a lost database connection) between the SMTP server's
// accept and the COMMIT. The transaction then rolls back, the broker
// redelivers the event, and the mail is sent again. Every copy carries the
// same Message-ID (MessageID) and an X-Ferry-Notification-Id header, so
// receivers and ESPs that deduplicate on Message-ID show it once, and the
// duplicate is detectable everywhere else.
//
// The second such window is a reply to the end of the data that never
// arrives (Config.SMTPDataTimeout expires or the connection is cut after
// the whole mail was written). ferry cannot know whether the server took
// the mail. The handler logs a WARN ("the SMTP server may have accepted
// the mail; ...") and returns an error wrapping ErrDeliveryUnknown, which
// the worker retries like any other: the trade-off is at-least-once (a
// possible duplicate, same Message-ID) over at-most-once (a possibly lost
// mail marked dead or sent without proof). An operator who prefers the
// other side can watch for ErrDeliveryUnknown in last_error, which keeps
// it after the retry that sends the mail (any other earlier error is
// cleared once the notification is sent).
//
// Mail is sent one SMTP connection per notification, with no TLS and no
// authentication (a local relay such as Mailpit).
package app
