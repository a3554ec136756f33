package outbox_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/outbox"
)

// setNotifyWindow sets the process-wide notify window for one test and
// restores it afterwards. Tests calling it must not be parallel (parallel
// tests only start once the sequential ones are done).
func setNotifyWindow(t *testing.T, d time.Duration) {
	t.Helper()
	prev, err := outbox.SetNotifyWindow(d)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = outbox.SetNotifyWindow(prev) })
}

// notifications counts the notifications conn receives until none comes
// for quiet.
func notifications(t *testing.T, conn *pgx.Conn, quiet time.Duration) int {
	t.Helper()
	n := 0
	for {
		ctx, cancel := context.WithTimeout(testCtx(t), quiet)
		_, err := conn.WaitForNotification(ctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			return n
		}
		require.NoError(t, err)
		n++
	}
}

// Within the notify window only the first Enqueue on a database sends
// the NOTIFY; a zero window notifies in every transaction; the window is
// kept per database.
func TestEnqueueNotifyWindow(t *testing.T) {
	ctx := testCtx(t)
	pool := migratedPool(t)
	other := migratedPool(t)
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "LISTEN "+outbox.NotifyChannel)
	require.NoError(t, err)
	otherConn, err := pgx.ConnectConfig(ctx, other.Config().ConnConfig.Copy())
	require.NoError(t, err)
	defer otherConn.Close(context.Background())
	_, err = otherConn.Exec(ctx, "LISTEN "+outbox.NotifyChannel)
	require.NoError(t, err)

	_, err = outbox.SetNotifyWindow(-time.Millisecond)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)

	setNotifyWindow(t, time.Hour)
	for range 3 {
		enqueue(t, pool, events(1, "a.b")...)
	}
	require.Equal(t, 1, notifications(t, conn, 300*time.Millisecond), "one NOTIFY per window")
	// Another database has its own window.
	enqueue(t, other, events(1, "a.b")...)
	require.Equal(t, 1, notifications(t, otherConn, 300*time.Millisecond), "the other database's first Enqueue")

	_, err = outbox.SetNotifyWindow(0)
	require.NoError(t, err)
	for range 3 {
		enqueue(t, pool, events(1, "a.b")...)
	}
	require.Equal(t, 3, notifications(t, conn, 300*time.Millisecond), "zero window: a NOTIFY per transaction")
}

// A transaction whose Enqueue left the NOTIFY to another one and that
// commits after the relay's claims following that NOTIFY is found by the
// recheck claim, not left for the poll (one hour here).
func TestRelayRecheckFindsRowWithoutNotify(t *testing.T) {
	setNotifyWindow(t, time.Hour)
	ctx := testCtx(t)
	rg := setup(t)
	batches := make(chan outbox.BatchStats, 16)
	runRelay(t, newRelay(t, outbox.RelayConfig{Pool: rg.pool, Broker: rg.b, PollInterval: time.Hour,
		RecheckDelay: 3 * time.Second, Concurrency: 2, Retention: -1,
		OnBatch: func(s outbox.BatchStats) { batches <- s }}))
	waitListening(t, rg.pool)

	txN, err := rg.pool.Begin(ctx)
	require.NoError(t, err)
	defer txN.Rollback(ctx) //nolint:errcheck // no-op after Commit
	txR, err := rg.pool.Begin(ctx)
	require.NoError(t, err)
	defer txR.Rollback(ctx)                                              //nolint:errcheck // no-op after Commit
	idN, err := outbox.Enqueue(ctx, txN, events(1, "test.notifying")...) // sends the NOTIFY
	require.NoError(t, err)
	idR, err := outbox.Enqueue(ctx, txR, events(1, "test.silent")...) // within the window: none
	require.NoError(t, err)
	require.NoError(t, txN.Commit(ctx))
	select {
	case s := <-batches:
		require.Equal(t, 1, s.Published)
	case <-time.After(30 * time.Second):
		t.Fatal("the NOTIFY did not wake the relay")
	}
	// The relay's claim after that batch came back empty by now; it
	// claims once more RecheckDelay (3 s) later.
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, txR.Commit(ctx))

	counts, _ := collect(t, rg.b, rg.queue, 2, 10*time.Millisecond)
	require.Equal(t, map[string]int{strconv.FormatInt(idN[0], 10): 1, strconv.FormatInt(idR[0], 10): 1}, counts)
	require.Eventually(t, func() bool { return unprocessed(t, rg.pool) == 0 }, 10*time.Second, 20*time.Millisecond)
}
