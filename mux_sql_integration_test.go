package ferry_test

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

type sqlJob struct {
	FailFirst bool `json:"fail_first"`
}

// TestSQLHandlerCommitsWithDedup: a handler registered with HandleSQL
// writes through its *sql.Tx, and that write commits with the worker's
// dedup row or not at all, on every broker (the redelivery that tests it
// is each broker's). A first attempt that fails rolls its write back (and
// the dedup row with it, or the retry would be taken for a duplicate); a
// copy of a handled message published again after the commit is absorbed
// as a duplicate, without running the handler.
func TestSQLHandlerCommitsWithDedup(t *testing.T) {
	forEachBroker(t, func(t *testing.T, name string) {
		bu := setup(t, name, "job.run")
		ctx := bu.ctx
		_, err := bu.pool.Exec(ctx, `CREATE TABLE sql_effects (message_id TEXT, attempt INT)`)
		require.NoError(t, err)

		mux := ferry.NewMux()
		require.NoError(t, ferry.HandleSQL(mux, "job.run", func(ctx context.Context, tx *sql.Tx, job *ferry.Job[sqlJob]) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO sql_effects VALUES ($1, $2)`, job.ID, job.Attempt); err != nil {
				return err
			}
			if job.Args.FailFirst && job.Attempt == 1 {
				return errors.New("first attempt fails after its write")
			}
			return nil
		}))
		var mu sync.Mutex
		outcomes := map[string][]string{}
		bu.start(t, ferry.Config{
			Relay: &outbox.RelayConfig{},
			Workers: []worker.Config{{Queue: bu.queue, SQLHandler: mux.HandleMessageSQL,
				OnOutcome: func(msg *broker.Message, o worker.Outcome, _ time.Duration) {
					mu.Lock()
					defer mu.Unlock()
					outcomes[msg.ID] = append(outcomes[msg.ID], o.String())
				}}},
		})
		got := func(id string) []string {
			mu.Lock()
			defer mu.Unlock()
			return append([]string(nil), outcomes[id]...)
		}

		db := stdlib.OpenDBFromPool(bu.pool)
		defer db.Close()
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		failing, err := ferry.EnqueueSQL(ctx, tx, "job.run", sqlJob{FailFirst: true})
		require.NoError(t, err)
		once, err := ferry.EnqueueSQL(ctx, tx, "job.run", sqlJob{})
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		fID, oID := strconv.FormatInt(failing, 10), strconv.FormatInt(once, 10)

		require.Eventually(t, func() bool { return len(got(fID)) == 2 && len(got(oID)) == 1 },
			45*time.Second, 50*time.Millisecond, "outcomes %v %v", got(fID), got(oID))
		require.Equal(t, []string{"retry", "ack"}, got(fID))
		require.Equal(t, []string{"ack"}, got(oID))

		// The handled message again, as a broker redelivers it after a
		// lost ack: the dedup row committed with the write absorbs it.
		require.NoError(t, bu.b.Publish(ctx, []*broker.Message{{ID: oID, Type: "job.run", Body: []byte(`{}`)}}))
		require.Eventually(t, func() bool { return len(got(oID)) == 2 }, 30*time.Second, 50*time.Millisecond)
		require.Equal(t, []string{"ack", "duplicate"}, got(oID))

		effects := map[string][]int{}
		rows, err := bu.pool.Query(ctx, `SELECT message_id, attempt FROM sql_effects ORDER BY message_id, attempt`)
		require.NoError(t, err)
		for rows.Next() {
			var id string
			var attempt int
			require.NoError(t, rows.Scan(&id, &attempt))
			effects[id] = append(effects[id], attempt)
		}
		require.NoError(t, rows.Err())
		// Attempt 1's write was rolled back with its failure; attempt 2's
		// committed; the duplicate wrote nothing.
		require.Equal(t, map[string][]int{fID: {2}, oID: {1}}, effects)
		var dedup int
		require.NoError(t, bu.pool.QueryRow(ctx, `SELECT count(*) FROM processed_messages WHERE consumer = $1 AND message_id IN ($2, $3)`,
			bu.queue, fID, oID).Scan(&dedup))
		require.Equal(t, 2, dedup)
	})
}

// TestMuxRefusesTheWrongTransaction: a Mux dead-letters at once, with
// ErrWrongTransaction, a message whose handler needs the other kind of
// transaction than the worker entry point gives; worker.New refuses a
// configuration with both handlers, and takes SQLHandler with batches.
func TestMuxRefusesTheWrongTransaction(t *testing.T) {
	mux := ferry.NewMux()
	require.NoError(t, ferry.HandleSQL(mux, "a.sql", func(context.Context, *sql.Tx, *ferry.Job[struct{}]) error { return nil }))
	require.NoError(t, ferry.Handle(mux, "a.pgx", func(context.Context, pgx.Tx, *ferry.Job[struct{}]) error { return nil }))
	require.Error(t, ferry.HandleSQL(mux, "a.sql", func(context.Context, *sql.Tx, *ferry.Job[struct{}]) error { return nil }))
	require.Equal(t, []string{"a.sql", "a.pgx"}, mux.Patterns())

	err := mux.HandleMessage(context.Background(), nil, &broker.Message{ID: "1", Type: "a.sql", Body: []byte(`{}`)})
	require.ErrorIs(t, err, ferry.ErrWrongTransaction)
	require.True(t, worker.IsPermanent(err))
	require.ErrorContains(t, err, "worker.Config.SQLHandler")
	err = mux.HandleMessageSQL(context.Background(), nil, &broker.Message{ID: "2", Type: "a.pgx", Body: []byte(`{}`)})
	require.ErrorIs(t, err, ferry.ErrWrongTransaction)
	err = mux.HandleMessageSQL(context.Background(), nil, &broker.Message{ID: "3", Type: "b.none", Body: []byte(`{}`)})
	require.ErrorIs(t, err, ferry.ErrNoHandler)
	err = mux.HandleMessageSQL(context.Background(), nil, &broker.Message{ID: "4", Type: "a.sql", Body: []byte(`[`)})
	require.ErrorIs(t, err, ferry.ErrUndecodable)

	bu := setup(t, "nats")
	base := worker.Config{Consumer: "c", Queue: bu.queue, Pool: bu.pool, Broker: bu.b}
	c := base
	c.Handler, c.SQLHandler = mux.HandleMessage, mux.HandleMessageSQL
	_, err = worker.New(c)
	require.ErrorContains(t, err, "set one")
	c = base
	c.SQLHandler, c.BatchSize = mux.HandleMessageSQL, 8
	_, err = worker.New(c)
	require.NoError(t, err, "SQLHandler with batches (a savepoint per message on the *sql.Tx)")
	c = base
	_, err = worker.New(c)
	require.ErrorContains(t, err, "Config.SQLHandler")
}
