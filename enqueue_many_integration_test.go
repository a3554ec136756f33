package ferry_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// statementLog records the SQL of every statement a pool's connections
// send, through pgx's tracer hooks, batched or not.
type statementLog struct {
	mu   sync.Mutex
	sqls []string
}

func (l *statementLog) add(sql string) {
	l.mu.Lock()
	l.sqls = append(l.sqls, sql)
	l.mu.Unlock()
}

func (l *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.add(d.SQL)
	return ctx
}

func (l *statementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (l *statementLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (l *statementLog) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	l.add(d.SQL)
}

func (l *statementLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// inserts returns how many recorded statements insert into the outbox table.
func (l *statementLog) inserts() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.sqls {
		if strings.Contains(s, "INSERT INTO outbox ") || strings.Contains(s, "INSERT INTO outbox(") {
			n++
		}
	}
	return n
}

// newUser is an event whose encoding fails for the user "bad", to make
// one arg of a batch invalid.
type newUser struct{ User string }

func (s newUser) MarshalJSON() ([]byte, error) {
	if s.User == "bad" {
		return nil, errors.New("no JSON for bad")
	}
	return json.Marshal(map[string]string{"user": s.User})
}

// storedBodies returns the outbox rows' ids and bodies in id order.
func storedBodies(t *testing.T, pool *pgxpool.Pool) (ids []int64, bodies []string) {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT id, convert_from(payload, 'UTF8') FROM outbox ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		var body string
		require.NoError(t, rows.Scan(&id, &body))
		ids, bodies = append(ids, id), append(bodies, body)
	}
	require.NoError(t, rows.Err())
	return ids, bodies
}

// TestEnqueueMany stores 500 events in one INSERT, returns their ids in
// the order of the args, applies the options to each, and stores nothing
// when one arg is invalid, naming that arg.
func TestEnqueueMany(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn := testenv.NewDatabase(t)
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	log := &statementLog{}
	cfg.ConnConfig.Tracer = log
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	require.NoError(t, outbox.Migrate(ctx, pool))

	args := make([]newUser, 500)
	want := make([]string, len(args))
	for i := range args {
		args[i] = newUser{User: fmt.Sprintf("u%03d", i)}
		want[i] = fmt.Sprintf(`{"user":"u%03d"}`, i)
	}
	before := log.inserts()
	var ids []int64
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		ids, err = ferry.EnqueueMany(ctx, tx, "user.signup", args, ferry.WithKey("signups"))
		return err
	}))
	require.Equal(t, 1, log.inserts()-before, "one INSERT for 500 events")
	stored, bodies := storedBodies(t, pool)
	require.Equal(t, stored, ids, "ids in the order of args")
	require.Equal(t, want, bodies)
	var keyed int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE partition_key = 'signups' AND event_type = 'user.signup'`).Scan(&keyed))
	require.Equal(t, 500, keyed, "every event has the options")

	// One invalid arg: an error naming it, nothing stored, tx still usable.
	bad := []newUser{{User: "a"}, {User: "b"}, {User: "bad"}, {User: "c"}}
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := ferry.EnqueueMany(ctx, tx, "user.signup", bad)
		require.ErrorIs(t, err, outbox.ErrInvalidEvent)
		require.ErrorContains(t, err, "args[2]")
		_, err = tx.Exec(ctx, `SELECT 1`)
		return err
	}))
	after, _ := storedBodies(t, pool)
	require.Len(t, after, 500, "nothing stored from the invalid batch")

	// No args: nothing.
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		ids, err := ferry.EnqueueMany[newUser](ctx, tx, "user.signup", nil)
		require.Nil(t, ids)
		return err
	}))

	// database/sql: the same rows, the same order.
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	tx, err := db.BeginTx(ctx, &sql.TxOptions{})
	require.NoError(t, err)
	sqlIDs, err := ferry.EnqueueManySQL(ctx, tx, "user.signup", []newUser{{User: "x"}, {User: "y"}})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	all, bodies := storedBodies(t, pool)
	require.Equal(t, all[len(all)-2:], sqlIDs)
	require.Equal(t, []string{`{"user":"x"}`, `{"user":"y"}`}, bodies[len(bodies)-2:])
}
