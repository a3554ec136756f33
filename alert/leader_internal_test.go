package alert

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/internal/testenv"
)

// Two webhooks on one host have the same String(); their stored queues
// must still not mix.
func TestNotifierKeysAreUnique(t *testing.T) {
	t.Parallel()
	w1, err := NewWebhook("http://127.0.0.1:9/a")
	require.NoError(t, err)
	w2, err := NewWebhook("http://127.0.0.1:9/b")
	require.NoError(t, err)
	tg, err := NewTelegram("1:x", "42", "http://127.0.0.1:9")
	require.NoError(t, err)
	require.Equal(t, []string{"webhook http://127.0.0.1:9", "webhook http://127.0.0.1:9#2", tg.String()},
		notifierKeys([]Notifier{w1, w2, tg}))
}

// The lock key is stable across processes and versions: it is what makes
// the replicas meet on one lock.
func TestLockObjIDStable(t *testing.T) {
	t.Parallel()
	require.Equal(t, LockObjID(DefaultName), LockObjID("FerryOutboxStuck"))
	require.NotEqual(t, LockObjID("a"), LockObjID("b"))
	require.Equal(t, int32(-468965076), LockObjID("a")) // FNV-1a 32 of "a" is 0xe40c292c
}

// The leader's session carries idle_session_timeout, so the server frees
// the lock of a leader that vanished without closing its connection.
func TestLeaderSessionHasIdleTimeout(t *testing.T) {
	pool, _ := testenv.NewPool(t)
	a, err := New(Config{
		Interval: 20 * time.Millisecond, Pool: pool,
		Source: func(context.Context) (int, time.Duration, error) { return 0, 0, nil },
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(t, err)
	defer a.Close()
	ctx := context.Background()
	a.Check(ctx)
	require.True(t, a.Leading())
	var v string
	require.NoError(t, a.lockConn.QueryRow(ctx, `SHOW idle_session_timeout`).Scan(&v))
	require.Equal(t, "1min", v)
}
