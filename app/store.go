package app

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Notification is the state of one notification, as GET /notifications/{id}
// returns it (the body is left out).
type Notification struct {
	// ID is the notification id, a decimal string.
	ID string `json:"id"`
	// UserID, Channel, To and Subject are as requested.
	UserID  string `json:"user_id"`
	Channel string `json:"channel"`
	To      string `json:"to"`
	Subject string `json:"subject"`
	// Status is StatusPending, StatusSent or StatusDead.
	Status string `json:"status"`
	// Attempts counts delivery attempts, failed and successful.
	Attempts int `json:"attempts"`
	// LastError is the reason of the last failed attempt; null when none
	// failed. A later success clears it, unless it is an ErrDeliveryUnknown
	// error (that attempt may have delivered a copy as well), which is
	// kept.
	LastError *string `json:"last_error"`
	// CreatedAt is when the request was accepted.
	CreatedAt time.Time `json:"created_at"`
	// SentAt is when the SMTP server accepted the mail; null until then.
	SentAt *time.Time `json:"sent_at"`
}

// Status returns the notification with the given id (a decimal string, as
// the API returns it). It returns an error wrapping ErrNotFound when there
// is none, including when id is not the canonical form of a positive
// int64 (digits only, no sign, no leading zero: "01" and "+1" are not
// aliases of "1").
func (a *App) Status(ctx context.Context, id string) (*Notification, error) {
	n, err := strconv.ParseInt(id, 10, 64)
	if err != nil || n <= 0 || strconv.FormatInt(n, 10) != id {
		return nil, fmt.Errorf("%w: id %q", ErrNotFound, clip(id))
	}
	var out Notification
	var dbID int64
	err = a.pool.QueryRow(ctx, `
		SELECT id, user_id, channel, to_addr, subject, status, attempts, last_error, created_at, sent_at
		FROM notifications WHERE id = $1`, n).Scan(
		&dbID, &out.UserID, &out.Channel, &out.To, &out.Subject, &out.Status, &out.Attempts, &out.LastError, &out.CreatedAt, &out.SentAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: id %d", ErrNotFound, n)
	}
	if err != nil {
		return nil, fmt.Errorf("app: status of %d: %w", n, err)
	}
	out.ID = strconv.FormatInt(dbID, 10)
	return &out, nil
}

// CountByStatus returns how many notifications have each status. The map
// always holds StatusPending, StatusSent and StatusDead (zero when none).
// It is one aggregate query, cheap enough to poll for progress.
func (a *App) CountByStatus(ctx context.Context) (map[string]int64, error) {
	rows, err := a.pool.Query(ctx, `SELECT status, count(*) FROM notifications GROUP BY status`)
	if err != nil {
		return nil, fmt.Errorf("app: count by status: %w", err)
	}
	out := map[string]int64{StatusPending: 0, StatusSent: 0, StatusDead: 0}
	var status string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&status, &n}, func() error {
		out[status] = n
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("app: count by status: %w", err)
	}
	return out, nil
}
