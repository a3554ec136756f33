package outbox_test

import (
	"os"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/pgmigrate"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// Two relays on one database, each with its own destination and exchange:
// each publishes exactly the events enqueued for it, and neither claims,
// publishes or parks the other's. Rows enqueued without a destination go
// to the default relay. (On main there was no destination: either relay
// claimed any row, and published it to an exchange where nothing was bound
// for it, parking it as unroutable.)
func TestRelaysClaimOnlyTheirDestination(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := migratedPool(t)
	type side struct {
		b           broker.Broker
		dest, queue string
		relay       *outbox.Relay
		ids         []int64
	}
	var sides []*side
	for _, dest := range []string{"svc-a", ""} {
		ex := testenv.UniqueName("outbox-dest")
		q := ex + ".work"
		typ := "test.a"
		if dest == "" {
			typ = "test.default"
		}
		b := newBroker(t) // an adapter publishes to one exchange
		require.NoError(t, b.Declare(ctx, broker.Topology{Exchange: ex, Queues: []broker.Queue{{Name: q, Bindings: []string{typ}}}}))
		t.Cleanup(func() { deleteRabbitObjects(t, ex) })
		var evs []outbox.Event
		for _, e := range events(20, typ) {
			e.Destination = dest
			evs = append(evs, e)
		}
		s := &side{b: b, dest: dest, queue: q, ids: enqueue(t, pool, evs...)}
		s.relay = newRelay(t, outbox.RelayConfig{Pool: pool, Broker: b, Destination: dest, BatchSize: 7})
		sides = append(sides, s)
	}
	var d string
	require.NoError(t, pool.QueryRow(ctx, `SELECT destination FROM outbox WHERE id = $1`, sides[1].ids[0]).Scan(&d))
	require.Equal(t, outbox.DefaultDestination, d)
	require.Equal(t, outbox.DefaultDestination, sides[1].relay.Config().Destination)

	// The first relay alone: it publishes its 20 rows and then finds
	// nothing, though the other 20 are unprocessed.
	total := 0
	for range 10 {
		n, err := sides[0].relay.ProcessBatch(ctx)
		require.NoError(t, err)
		total += n
	}
	require.Equal(t, 20, total)
	require.Equal(t, 20, unprocessed(t, pool))
	stop := runRelay(t, sides[1].relay)
	defer stop()
	for _, s := range sides {
		got, _ := collect(t, s.b, s.queue, 20, 300*time.Millisecond)
		require.Len(t, got, 20, "destination %q", s.dest)
		for _, id := range idStrings(s.ids) {
			require.Equal(t, 1, got[id], "destination %q: message %s", s.dest, id)
		}
	}
	require.Eventually(t, func() bool { return unprocessed(t, pool) == 0 }, 10*time.Second, 20*time.Millisecond)
	var attempts int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE attempts > 0`).Scan(&attempts))
	require.Zero(t, attempts, "no row was parked")

	_, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Broker: sides[0].b, Destination: "two words"})
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	require.ErrorContains(t, err, "Destination")
	require.ErrorIs(t, outbox.Event{Type: "a.b", Body: []byte{}, Destination: "a\nb"}.Validate(), outbox.ErrInvalidEvent)
}

// The claim reads only its destination's rows: with 20000 rows of another
// destination due (another service's backlog), 2000 of its own waiting
// (scheduled) and 50000 processed, the claim of the few due rows of its
// own walks the destination indexes of migration 5 and reads none of the
// other destination's or the processed rows: its cost is that of the
// claim of a database holding only its own rows.
func TestClaimReadsOnlyItsDestination(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := migratedPool(t)
	_, err := pool.Exec(ctx, `INSERT INTO outbox (event_type, payload, destination)
		SELECT 'a.other', '', 'other' FROM generate_series(1, 20000)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO outbox (event_type, payload, next_attempt_at, occurred_at, destination)
		SELECT 'a.later', '', now() + interval '1 day', now() + interval '1 day', 'mine' FROM generate_series(1, 2000)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO outbox (event_type, payload, processed_at, destination)
		SELECT 'a.done', '', now(), 'mine' FROM generate_series(1, 50000)`)
	require.NoError(t, err)
	var evs []outbox.Event
	for _, e := range events(5, "a.now") {
		e.Destination = "mine"
		evs = append(evs, e)
	}
	enqueue(t, pool, evs...)
	_, err = pool.Exec(ctx, `ANALYZE outbox`)
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	rows, err := tx.Query(ctx, `EXPLAIN (ANALYZE, COSTS OFF) `+outbox.ClaimSQL, 100, 10000, "mine", int32(7))
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := strings.Join(lines, "\n")
	t.Log(plan)
	require.Contains(t, plan, "outbox_unprocessed_dest_idx")
	require.NotContains(t, plan, "outbox_pkey")
	require.Contains(t, plan, "outbox_ready_dest_idx", "the lowest due row is one probe")
	// The claim walks its index range in order and stops at the limit: no
	// sort of every candidate (which would also take the key slots of
	// rows it does not claim).
	require.Regexp(t, `LockRows[^\n]*\n\s*->  Index Scan using outbox_unprocessed_dest_idx`, plan)
	// At most its own 2000 waiting rows are filtered, as by the claim of
	// one destination; never the other's 20000 or the 50000 processed.
	require.NotRegexp(t, `Rows Removed by Filter: (\d{5,}|[3-9]\d{3})`, plan)
	require.Contains(t, plan, "rows=5 loops=1", "the claim returns the 5 due rows of its own")
}

// ReadStats splits the backlog by destination and names the destination
// of each parked row, so an operator sees which service's relay is
// missing or which topology refuses its events.
func TestStatsByDestination(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := migratedPool(t)
	ids := enqueue(t, pool,
		outbox.Event{Type: "a.b", Body: []byte{}, Destination: "billing"},
		outbox.Event{Type: "a.b", Body: []byte{}, Destination: "billing"},
		outbox.Event{Type: "a.b", Body: []byte{}, Destination: "billing", DueAt: time.Now().Add(time.Hour)},
		outbox.Event{Type: "a.b", Body: []byte{}},
	)
	_, err := pool.Exec(ctx, `UPDATE outbox SET attempts = 1, last_error = 'unroutable' WHERE id = $1`, ids[1])
	require.NoError(t, err)
	s, err := outbox.ReadStats(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, []outbox.DestinationStats{
		{Destination: "billing", Unprocessed: 2, Scheduled: 1, Parked: 1},
		{Destination: outbox.DefaultDestination, Unprocessed: 1},
	}, s.Destinations)
	require.Equal(t, int64(3), s.Unprocessed)
	require.Equal(t, int64(1), s.Scheduled)
	require.Equal(t, int64(1), s.Parked)
	require.Len(t, s.ParkedRows, 1)
	require.Equal(t, "billing", s.ParkedRows[0].Destination)
	p, err := outbox.RetryParked(ctx, pool, ids[1])
	require.NoError(t, err)
	require.Equal(t, "billing", p.Destination)
}

// A database migrated before destinations keeps its unpublished rows:
// migration 5 gives them the default destination, and a relay without a
// Destination publishes them.
func TestMigrationGivesOldRowsTheDefaultDestination(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool, _ := testenv.NewPool(t)
	old := fstest.MapFS{}
	for _, name := range []string{"00001_outbox.sql", "00002_outbox_key_order.sql", "00003_worker_attempts.sql", "00004_outbox_scheduled.sql"} {
		b, err := os.ReadFile("migrations/" + name)
		require.NoError(t, err)
		old[name] = &fstest.MapFile{Data: b}
	}
	require.NoError(t, pgmigrate.Set{FS: old, Table: outbox.MigrationsTable, LockID: 1, LockTimeout: 60}.Up(ctx, pool))
	_, err := pool.Exec(ctx, `INSERT INTO outbox (event_type, payload) VALUES ('test.old', '\x7b7d')`)
	require.NoError(t, err)

	require.NoError(t, outbox.Migrate(ctx, pool))
	current, latest, err := outbox.MigrationVersion(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, latest, current)
	var dest string
	require.NoError(t, pool.QueryRow(ctx, `SELECT destination FROM outbox`).Scan(&dest))
	require.Equal(t, outbox.DefaultDestination, dest)
	b := newBroker(t)
	ex := testenv.UniqueName("outbox-dest")
	require.NoError(t, b.Declare(ctx, broker.Topology{Exchange: ex, Queues: []broker.Queue{{Name: ex + ".work", Bindings: []string{"test.old"}}}}))
	t.Cleanup(func() { deleteRabbitObjects(t, ex) })
	n, err := newRelay(t, outbox.RelayConfig{Pool: pool, Broker: b}).ProcessBatch(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
}
