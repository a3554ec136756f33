package outbox_test

import (
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/outbox"
)

// Twenty concurrent transactions enqueue an event with one UniqueKey: one
// row is stored and all twenty get its id; inside the window a later
// Enqueue (also through database/sql) stores nothing and gets that id;
// after the window a new event is stored. On main there was no UniqueKey:
// twenty rows.
func TestEnqueueUniqueConcurrent(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := migratedPool(t)
	// 10 s: everything "inside the window" must run within it; with 2 s,
	// twenty transactions queued on a 4-connection pool of a loaded CI
	// machine took longer, and the batch enqueue after them opened a new
	// window (as it should, once the window is over).
	const window = 10 * time.Second
	ev := outbox.Event{Type: "email.welcome", Body: []byte(`{}`), UniqueKey: "email.welcome:user-42", UniqueFor: window}

	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		ids   []int64
		start = make(chan struct{})
	)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var got []int64
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				var err error
				got, err = outbox.Enqueue(ctx, tx, ev)
				time.Sleep(20 * time.Millisecond) // hold the key while others wait
				return err
			})
			require.NoError(t, err)
			mu.Lock()
			ids = append(ids, got...)
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	require.Len(t, ids, 20)
	for _, id := range ids {
		require.Equal(t, ids[0], id)
	}
	count := func() (n int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE event_type = 'email.welcome'`).Scan(&n))
		return n
	}
	require.Equal(t, 1, count())
	var stored int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT id FROM outbox`).Scan(&stored))
	require.Equal(t, stored, ids[0])

	// In a batch with other events: the unique one is not stored again,
	// the others are, in order.
	got := enqueue(t, pool, outbox.Event{Type: "a.before", Body: []byte{}}, ev, outbox.Event{Type: "a.after", Body: []byte{}})
	require.Equal(t, ids[0], got[1])
	require.Less(t, got[0], got[2])
	require.Equal(t, 1, count())
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	sqlIDs, err := outbox.EnqueueSQL(ctx, tx, ev)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	require.Equal(t, []int64{ids[0]}, sqlIDs)
	require.Equal(t, 1, count())

	// After the window: a new event.
	time.Sleep(window)
	again := enqueue(t, pool, ev)
	require.NotEqual(t, ids[0], again[0])
	require.Equal(t, 2, count())
	require.Equal(t, again, enqueue(t, pool, ev), "the new event opened a new window")

	// The window's end is pruned.
	res, err := outbox.Prune(ctx, pool, time.Hour, 0)
	require.NoError(t, err)
	require.Zero(t, res.UniqueKeys, "the key is inside its new window")
}

// A first transaction that rolls back leaves no key behind: a concurrent
// Enqueue of the same key that waited for it stores its own event.
func TestEnqueueUniqueAfterRollback(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := migratedPool(t)
	ev := outbox.Event{Type: "a.b", Body: []byte{}, UniqueKey: "k", UniqueFor: time.Hour}
	tx1, err := pool.Begin(ctx)
	require.NoError(t, err)
	first, err := outbox.Enqueue(ctx, tx1, ev)
	require.NoError(t, err)
	done := make(chan []int64, 1)
	go func() {
		var ids []int64
		_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			ids, err = outbox.Enqueue(ctx, tx, ev)
			return err
		})
		done <- ids
	}()
	time.Sleep(200 * time.Millisecond) // the second waits on the key
	require.NoError(t, tx1.Rollback(ctx))
	second := <-done
	require.Len(t, second, 1)
	require.NotEqual(t, first[0], second[0])
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE id = $1`, second[0]).Scan(&n))
	require.Equal(t, 1, n)

	// Expired keys are pruned.
	_, err = pool.Exec(ctx, `UPDATE outbox_unique SET expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	res, err := outbox.Prune(ctx, pool, time.Hour, 0)
	require.NoError(t, err)
	require.Equal(t, int64(1), res.UniqueKeys)

	for _, bad := range []outbox.Event{
		{Type: "a.b", Body: []byte{}, UniqueKey: "k"},
		{Type: "a.b", Body: []byte{}, UniqueFor: time.Second},
		{Type: "a.b", Body: []byte{}, UniqueKey: "k", UniqueFor: -time.Second},
	} {
		require.ErrorIs(t, bad.Validate(), outbox.ErrInvalidEvent)
	}
}
