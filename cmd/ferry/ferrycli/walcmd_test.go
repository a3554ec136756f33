package ferrycli_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// nameOnly is a broker.Broker that only names itself: EnsureSlot's relay
// publishes nothing.
type nameOnly struct{ broker.Broker }

func (nameOnly) Capabilities() broker.Capabilities { return broker.Capabilities{Name: "none"} }

// `ferry outbox stats` lists a WAL relay's slot with its unconfirmed
// events; a dropped slot reads as lost with what to do; `ferry outbox
// wal-reset --yes` hands the unconfirmed events to the polling side.
func TestOutboxStatsAndWALReset(t *testing.T) {
	db := testenv.NewDatabase(t)
	code, errOut := runFor(t, 30*time.Second, "migrate", "--database-url", db)
	require.Equal(t, 0, code, errOut)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, db)
	require.NoError(t, err)
	defer pool.Close()
	slot := fmt.Sprintf("ferry_cli_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)
	r, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Broker: nameOnly{}, Mode: outbox.RelayModeWAL, Slot: slot})
	require.NoError(t, err)
	require.NoError(t, r.EnsureSlot(ctx))
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, outbox.Event{Type: "a.b", Body: []byte{}}, outbox.Event{Type: "a.b", Body: []byte{}}, outbox.Event{Type: "a.b", Body: []byte{}})
		return err
	}))
	code, out, errOut := run(t, "outbox", "stats", "--database-url", db)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "WAL relays")
	require.Regexp(t, slot+`\s+default\s+standing by \(no relay streams\)\s+\d+ bytes\s+\S+\s+3\s`, out)
	code, out, errOut = run(t, "outbox", "stats", "--database-url", db, "--format", "json")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `"slot": "`+slot+`"`)
	require.Contains(t, out, `"unconfirmed": 3`)

	_, err = pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot)
	require.NoError(t, err)
	code, out, errOut = run(t, "outbox", "stats", "--database-url", db)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "SLOT LOST: run ferry outbox wal-reset")

	code, errOut = runFor(t, 20*time.Second, "outbox", "wal-reset", "--database-url", db, "--wal-slot", slot)
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, "add --yes to confirm")
	code, out, errOut = run(t, "outbox", "wal-reset", "--database-url", db, "--wal-slot", slot, "--yes")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "slot "+slot+" forgotten; 3 unconfirmed event(s) handed to the polling side")
	code, out, errOut = run(t, "outbox", "stats", "--database-url", db, "--format", "json")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `"wal": []`)
}

// The relay mode and slot flags are checked like the others.
func TestRelayModeFlagErrors(t *testing.T) {
	checkCases(t, []cliCase{
		{nil, []string{"relay", "--relay-mode", "tail"}, 2, `ferry: usage: --relay-mode "tail": want poll or wal`},
		{nil, []string{"relay", "--mode", "tail"}, 2, `ferry: usage: --relay-mode "tail": want poll or wal`},
		{nil, []string{"relay", "--relay-mode", "wal", "--wal-slot", "Bad-Slot"}, 2, `ferry: usage: --wal-slot "Bad-Slot": want lower-case letters, digits and '_' only (PostgreSQL's rule for slot names)`},
	})
}
