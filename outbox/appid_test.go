package outbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// TestEnqueueAppID: Event.AppID is stored as the header broker.HeaderAppID
// next to the event's own headers (which it does not change); an AppID
// that is too long or holds control characters is refused with
// ErrInvalidEvent, naming the field.
func TestEnqueueAppID(t *testing.T) {
	pool, _ := testenv.NewPool(t)
	ctx := context.Background()
	require.NoError(t, outbox.Migrate(ctx, pool))
	own := map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	ids := enqueue(t, pool, outbox.Event{Type: "notification.requested", Body: []byte(`{}`), AppID: "42", Headers: own})
	var headers map[string]string
	require.NoError(t, pool.QueryRow(ctx, `SELECT headers FROM outbox WHERE id = $1`, ids[0]).Scan(&headers))
	require.Equal(t, map[string]string{broker.HeaderAppID: "42", "traceparent": own["traceparent"]}, headers)
	require.Len(t, own, 1, "the caller's map is not changed")

	for _, bad := range []string{strings.Repeat("9", outbox.MaxAppIDBytes+1), "a\nb", "\xff"} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(ctx, tx, outbox.Event{Type: "notification.requested", Body: []byte(`{}`), AppID: bad})
			return err
		})
		require.ErrorIs(t, err, outbox.ErrInvalidEvent)
		require.Contains(t, err.Error(), "AppID")
	}
}
