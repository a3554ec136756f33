package ferry_test

import (
	"context"
	"slices"
	"sort"
	"strconv"
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

type orderPlaced struct {
	OrderID int64 `json:"order_id"`
}

type invoiceSent struct {
	Invoice string `json:"invoice"`
}

// TestMuxOnEveryBroker: one worker, one queue, two event types routed to
// two typed handlers (one enqueued through pgx, one through database/sql);
// a type with no handler and a body that does not decode each land in the
// DLQ exactly once with their reason, and no handler runs for them.
func TestMuxOnEveryBroker(t *testing.T) {
	forEachBroker(t, func(t *testing.T, name string) {
		bu := setup(t, name, "order.*", "invoice.sent", "refund.#")
		if !bu.b.Capabilities().Wildcards {
			// The mux matches its patterns all the same; only the
			// queue's bindings must name the types.
			bu.topo.Queues[0].Bindings = []string{"order.placed", "order.cancelled", "invoice.sent", "refund.issued"}
		}
		ctx := bu.ctx
		_, err := bu.pool.Exec(ctx, `CREATE TABLE handled (handler TEXT, message_id TEXT, value TEXT)`)
		require.NoError(t, err)

		mux := ferry.NewMux()
		require.NoError(t, ferry.Handle(mux, "order.*", func(ctx context.Context, tx pgx.Tx, job *ferry.Job[orderPlaced]) error {
			_, err := tx.Exec(ctx, `INSERT INTO handled VALUES ('orders', $1, $2)`, job.ID, job.Type+"/"+itoa(job.Args.OrderID))
			return err
		}))
		require.NoError(t, ferry.Handle(mux, "invoice.sent", func(ctx context.Context, tx pgx.Tx, job *ferry.Job[invoiceSent]) error {
			_, err := tx.Exec(ctx, `INSERT INTO handled VALUES ('invoices', $1, $2)`, job.ID, job.Args.Invoice)
			return err
		}))
		bu.start(t, ferry.Config{
			Relay:   &outbox.RelayConfig{},
			Workers: []worker.Config{{Queue: bu.queue, Handler: mux.HandleMessage}},
		})

		// Typed enqueue through pgx ...
		require.NoError(t, pgx.BeginFunc(ctx, bu.pool, func(tx pgx.Tx) error {
			for _, id := range []int64{1, 2} {
				if _, err := ferry.Enqueue(ctx, tx, "order.placed", orderPlaced{OrderID: id}, ferry.WithKey("c1")); err != nil {
					return err
				}
			}
			_, err := ferry.Enqueue(ctx, tx, "order.cancelled", orderPlaced{OrderID: 3})
			return err
		}))
		// ... and through database/sql on the pgx driver.
		db := stdlib.OpenDBFromPool(bu.pool)
		defer db.Close()
		stx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		_, err = ferry.EnqueueSQL(ctx, stx, "invoice.sent", invoiceSent{Invoice: "INV-7"}, ferry.WithHeader("tenant", "t1"))
		require.NoError(t, err)
		require.NoError(t, stx.Commit())
		// A rolled-back database/sql transaction publishes nothing.
		stx, err = db.BeginTx(ctx, nil)
		require.NoError(t, err)
		_, err = ferry.EnqueueSQL(ctx, stx, "invoice.sent", invoiceSent{Invoice: "INV-rolled-back"})
		require.NoError(t, err)
		require.NoError(t, stx.Rollback())

		// The bad ones: a bound type nobody handles, and a body that is
		// not an orderPlaced.
		var badIDs []int64
		require.NoError(t, pgx.BeginFunc(ctx, bu.pool, func(tx pgx.Tx) error {
			ids, err := outbox.Enqueue(ctx, tx,
				outbox.Event{Type: "refund.issued", Body: []byte(`{"order_id":1}`)},
				outbox.Event{Type: "order.placed", Body: []byte(`{"order_id":"not a number"}`)})
			badIDs = ids
			return err
		}))

		want := []string{"invoices INV-7", "orders order.cancelled/3", "orders order.placed/1", "orders order.placed/2"}
		require.Eventually(t, func() bool { return slices.Equal(handledRows(t, bu.pool), want) },
			30*time.Second, 50*time.Millisecond, "handled: %v", handledRows(t, bu.pool))

		dlq, err := bu.b.DLQ(bu.queue)
		require.NoError(t, err)
		var reasons map[string]string
		require.Eventually(t, func() bool {
			reasons = deadReasons(t, dlq)
			return len(reasons) >= 2
		}, 30*time.Second, 100*time.Millisecond)
		// Dead-lettered at once and once: no retry brings them back.
		time.Sleep(2 * time.Second)
		reasons = deadReasons(t, dlq)
		require.Len(t, reasons, 2, "DLQ: %v", reasons)
		unknown, undecodable := reasons[itoa(badIDs[0])], reasons[itoa(badIDs[1])]
		require.Contains(t, unknown, ferry.ErrNoHandler.Error())
		require.Contains(t, unknown, `"refund.issued"`)
		require.Contains(t, undecodable, ferry.ErrUndecodable.Error())
		require.Contains(t, undecodable, "ferry_test.orderPlaced")
		require.Equal(t, want, handledRows(t, bu.pool), "no handler ran for the dead messages")
	})
}

func handledRows(t *testing.T, pool interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) []string {
	rows, err := pool.Query(context.Background(), `SELECT handler || ' ' || value FROM handled`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	sort.Strings(out)
	return out
}

// deadReasons maps the ID of each message in dlq to its reason, failing
// on a message that is there twice.
func deadReasons(t *testing.T, dlq broker.DeadLetterQueue) map[string]string {
	dead, err := dlq.List(context.Background(), 0)
	require.NoError(t, err)
	out := map[string]string{}
	for _, d := range dead {
		_, twice := out[d.Message.ID]
		require.False(t, twice, "message %s is in the DLQ twice", d.Message.ID)
		out[d.Message.ID] = d.LastError
	}
	return out
}

func itoa(i int64) string { return strconv.FormatInt(i, 10) }
