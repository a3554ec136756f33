package app

import (
	"context"
	"errors"
	"fmt"
	"net/textproto"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	mail "github.com/wneessen/go-mail"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/worker"
)

// HeaderNotificationID is the mail header carrying the notification id.
const HeaderNotificationID = "X-Ferry-Notification-Id"

// The handler and the failure hook have the worker's signatures.
var (
	_ worker.Handler     = (*App)(nil).HandleNotification
	_ worker.FailureFunc = (*App)(nil).OnFailure
)

// Validate reports a RequestedEvent that names no notification: its
// NotificationID must be a positive decimal integer. ferry.Decode calls it,
// so such an event is dead-lettered at once (ferry.ErrInvalidEvent).
func (e RequestedEvent) Validate() error {
	if _, err := e.id(); err != nil {
		return err
	}
	return nil
}

// id returns the notification id the event names.
func (e RequestedEvent) id() (int64, error) {
	id, err := strconv.ParseInt(e.NotificationID, 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("notification_id %q is not a positive decimal integer", clip(e.NotificationID))
	}
	return id, nil
}

// newMux returns the service's handlers: EventNotificationRequested, its
// JSON body decoded into a RequestedEvent, handled by handleRequested.
func (a *App) newMux() (*ferry.Mux, error) {
	m := ferry.NewMux()
	if err := ferry.Handle(m, EventNotificationRequested, a.handleRequested); err != nil {
		return nil, fmt.Errorf("app: %w", err)
	}
	return m, nil
}

// Mux returns the service's handler mux: the routes of the notification
// queue (EventNotificationRequested). HandleNotification is its
// HandleMessage.
func (a *App) Mux() *ferry.Mux { return a.mux }

// HandleNotification is the worker.Handler for EventNotificationRequested,
// run inside the worker's deduplication transaction tx. It locks the
// notification row (SELECT ... FOR UPDATE), returns nil at once when the
// notification is already sent, otherwise marks the row sent with
// attempts+1 and then sends the mail to the SMTP server. The mark is
// written before the send, in tx, so it commits only when the send
// succeeded and the handler returned nil; once the SMTP server has
// accepted the mail nothing but the worker's COMMIT remains.
//
// The send honours ctx: when ctx is done (a worker whose shutdown timeout
// expired) the SMTP dialogue is cut and an error wrapping ctx's error is
// returned, except while the server is deciding on a mail it has received
// in full; then the handler waits for the answer (at most
// Config.SMTPDataTimeout, or until the worker gives up on it after
// worker.ShutdownGrace and the process exits), so an accepted mail is
// reported as sent (nil) even though ctx is done.
// When that answer does not come (a timeout, a cut connection) the server
// may have the mail: the error wraps ErrDeliveryUnknown and stays
// retryable, so a retry may send a second copy with the same Message-ID.
//
// It routes through the service's Mux: a message of another type is
// dead-lettered at once (ferry.ErrNoHandler), and a payload that does not
// decode into a RequestedEvent (ferry.ErrUndecodable), or names no
// positive notification id (ferry.ErrInvalidEvent), too; a notification
// id with no row is
// worker.Permanent as well (ErrNotFound). An SMTP 5xx answer is permanent
// too, at any step of the dialogue (greeting, EHLO/HELO, MAIL, RCPT, end
// of data); other SMTP and network errors, 4xx answers included, are
// returned for a retry.
//
// Delivery is at least once: if the transaction fails to commit after the
// SMTP server took the mail (a crash, a lost database connection), the
// redelivery sends it again. Every copy has the same Message-ID (derived
// from the notification id and creation time) and the
// X-Ferry-Notification-Id header, so duplicates are detectable.
func (a *App) HandleNotification(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
	return a.mux.HandleMessage(ctx, tx, msg)
}

// handleRequested handles one decoded EventNotificationRequested; see
// HandleNotification.
func (a *App) handleRequested(ctx context.Context, tx pgx.Tx, job *ferry.Job[RequestedEvent]) error {
	msg := job.Message
	id, err := job.Args.id()
	if err != nil { // Validate already refused it
		return worker.Permanent(err)
	}
	var to, subject, body, status string
	var createdAt time.Time
	err = tx.QueryRow(ctx, `
		SELECT to_addr, subject, body, status, created_at
		FROM notifications WHERE id = $1 FOR UPDATE`, id).Scan(&to, &subject, &body, &status, &createdAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return worker.Permanent(fmt.Errorf("%w: id %d (message %s)", ErrNotFound, id, msg.ID))
	}
	if err != nil {
		return fmt.Errorf("app: lock notification %d: %w", id, err)
	}
	if status == StatusSent {
		a.log.Debug("app: notification already sent; skipping", "notification_id", id, "message_id", msg.ID)
		return nil
	}
	// Mark it sent first: after the SMTP server accepts the mail, only the
	// commit is left, so a cancelled ctx or a failing statement can no
	// longer undo the mark of a mail that went out. If the send fails, the
	// worker rolls tx back and the mark with it. The error of an earlier
	// attempt (one before a DLQ replay, say) no longer describes a sent
	// notification and is cleared, unless it was ErrDeliveryUnknown: that
	// earlier attempt may have delivered a copy too, which the operator
	// watching last_error must still see.
	if _, err := tx.Exec(ctx, `
		UPDATE notifications
		SET status = 'sent', attempts = attempts + 1, sent_at = now(), updated_at = now(),
		    last_error = CASE WHEN strpos(last_error, $2) > 0 THEN last_error END
		WHERE id = $1`, id, ErrDeliveryUnknown.Error()); err != nil {
		return fmt.Errorf("app: mark notification %d sent: %w", id, err)
	}
	if err := a.send(ctx, id, createdAt, to, subject, body); err != nil {
		if smtpPermanent(err) {
			return worker.Permanent(err)
		}
		return err
	}
	return nil
}

// smtpPermanent reports whether err carries an SMTP 5xx reply, wherever in
// the dialogue it came: the greeting, EHLO/HELO, MAIL, RCPT or the end of
// the data. RFC 5321 section 4.2.1: a 5yz reply is a permanent negative
// completion, the same request will not succeed; a 4xx (421 at the
// greeting: service not available) is transient.
func smtpPermanent(err error) bool {
	var se *mail.SendError
	if errors.As(err, &se) && se.ErrorCode() >= 500 && se.ErrorCode() < 600 {
		return true
	}
	var te *textproto.Error
	return errors.As(err, &te) && te.Code >= 500 && te.Code < 600
}

// MessageID returns the Message-ID (without angle brackets) of the mail of
// notification id created at createdAt: the same for every copy sent.
func (a *App) MessageID(id int64, createdAt time.Time) string {
	return fmt.Sprintf("notification-%d.%d@%s", id, createdAt.UnixMicro(), a.fromDomain)
}

// send delivers one mail over a fresh SMTP connection. It returns nil once
// the server has accepted the mail, whatever happens to the session
// afterwards; when ctx is done first it cuts the session (see sendGuard)
// and returns an error wrapping ctx.Err(). When the whole mail was sent
// but no reply to it came, the error wraps ErrDeliveryUnknown.
func (a *App) send(ctx context.Context, id int64, createdAt time.Time, to, subject, body string) error {
	m := mail.NewMsg()
	if err := m.From(a.cfg.SMTPFrom); err != nil {
		return fmt.Errorf("app: notification %d: from %q: %w", id, a.cfg.SMTPFrom, err)
	}
	if err := m.To(to); err != nil {
		return worker.Permanent(fmt.Errorf("app: notification %d: to %q: %w", id, to, err))
	}
	m.Subject(subject)
	m.SetMessageIDWithValue(a.MessageID(id, createdAt))
	m.SetGenHeader(HeaderNotificationID, strconv.FormatInt(id, 10))
	m.SetDate()
	m.SetBodyString(mail.TypeTextPlain, body)
	g := &sendGuard{cmdTimeout: a.cfg.SMTPTimeout, dataTimeout: a.cfg.SMTPDataTimeout}
	stop := context.AfterFunc(ctx, g.cancel)
	defer stop()
	err := a.mail.DialAndSendWithContext(context.WithValue(ctx, sendGuardKey{}, g), m)
	switch {
	case err == nil:
		return nil
	case m.IsDelivered():
		// The server accepted the mail; only QUIT failed (or was cut
		// because ctx is done). The mail is sent.
		a.log.Debug("app: mail accepted; closing the SMTP session failed", "notification_id", id, "error", err)
		return nil
	case g.ambiguous():
		// The whole mail went out, the reply to it did not come: the
		// server may have it. Retryable (at least once), never reported
		// as "not accepted".
		a.log.Warn("app: the SMTP server may have accepted the mail; no reply to the end of the data, a retry may send a second copy with the same Message-ID",
			"notification_id", id, "smtp", a.cfg.SMTPAddr, "message_id", a.MessageID(id, createdAt), "shutdown", ctx.Err() != nil, "error", err)
		if ctx.Err() != nil {
			return fmt.Errorf("%w (notification %d, smtp %s, shutting down): %w: %w", ErrDeliveryUnknown, id, a.cfg.SMTPAddr, err, ctx.Err())
		}
		return fmt.Errorf("%w (notification %d, smtp %s): %w", ErrDeliveryUnknown, id, a.cfg.SMTPAddr, err)
	case ctx.Err() != nil:
		return fmt.Errorf("app: notification %d: smtp %s: sending cut short before the server had the whole mail, so it was not accepted: %w", id, a.cfg.SMTPAddr, ctx.Err())
	}
	return fmt.Errorf("app: notification %d: smtp %s: %w", id, a.cfg.SMTPAddr, err)
}

// OnFailure is the worker.Config.OnFailure hook (a worker.FailureFunc):
// after a failed attempt it adds one to the notification's attempts and
// records cause as last_error (cut to broker.MaxReasonBytes, NUL removed);
// when dead is true (the message goes to the DLQ) the notification becomes
// StatusDead, unless it was already sent. It is idempotent as the worker
// requires: a repeated call for the same message ID and msg.Attempt counts
// once. A message of another type, or a payload that does not parse,
// names no row, so nothing is updated and nil is returned (the worker
// dead-letters the message itself).
func (a *App) OnFailure(ctx context.Context, tx pgx.Tx, msg *broker.Message, cause error, dead bool) error {
	if msg == nil || msg.Type != EventNotificationRequested {
		// The mux found no handler for it (ferry.ErrNoHandler): its body
		// names no notification of ours, whatever it looks like.
		return nil
	}
	ev, err := ferry.Decode[RequestedEvent](msg)
	if err != nil {
		a.log.Warn("app: failure of an unparseable message", "error", err)
		return nil
	}
	id, _ := ev.id() // Decode ran Validate
	reason := "unknown error"
	if cause != nil {
		reason = cause.Error()
	}
	reason = broker.TruncateReason(strings.ReplaceAll(reason, "\x00", ""))
	var failureKey *string // nil: the attempt is unknown, always count it
	if msg.Attempt > 0 {
		k := msg.ID + "/" + strconv.Itoa(msg.Attempt)
		failureKey = &k
	}
	if _, err := tx.Exec(ctx, `
		UPDATE notifications
		SET attempts = attempts + CASE WHEN $4::text IS NULL OR last_failure_key IS DISTINCT FROM $4::text THEN 1 ELSE 0 END,
		    last_failure_key = $4::text,
		    last_error = $2,
		    status = CASE WHEN $3 AND status <> 'sent' THEN 'dead' ELSE status END,
		    updated_at = now()
		WHERE id = $1`, id, reason, dead, failureKey); err != nil {
		return fmt.Errorf("app: record failure of notification %d: %w", id, err)
	}
	return nil
}
