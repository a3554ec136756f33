package alert

import (
	"testing"

	"github.com/stretchr/testify/require"
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
