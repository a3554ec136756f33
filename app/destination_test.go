package app_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/app"
	"github.com/ferrymq/ferry/outbox"
)

// The API enqueues its events for Config.Destination (the CLI's
// --destination), so only the relay of that destination publishes them;
// without one they go to the default destination. A bad name is refused.
func TestAPIEnqueuesForItsDestination(t *testing.T) {
	t.Parallel()
	for _, dest := range []string{"notifier", ""} {
		b := setup(t, app.Config{Destination: dest})
		r := b.post(t, valid(), nil)
		require.Equal(t, http.StatusCreated, r.status, "%s", r.raw)
		var got string
		require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT destination FROM outbox`).Scan(&got))
		want := dest
		if want == "" {
			want = outbox.DefaultDestination
		}
		require.Equal(t, want, got)
	}
	_, err := app.New(app.Config{Pool: setup(t, app.Config{}).pool, Destination: "two words"})
	require.ErrorIs(t, err, app.ErrConfig)
	require.ErrorContains(t, err, "Destination")
}
