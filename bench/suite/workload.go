package suite

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferrymq/ferry/app"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// EventType is the routing key of every benchmark event: the sample app's
// notification.requested.
const EventType = app.EventNotificationRequested

// DefaultSize is the default event body in bytes: with the ID, type, key
// and headers (traceparent, created-at) a message is about 300 bytes, the
// sample app's notification.requested.
const DefaultSize = 160

// Traceparent is the W3C trace context every benchmark event carries, as
// the sample app's API does.
const Traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

const traceparent = Traceparent

// EventBody returns the JSON body of the benchmark event of notification
// id, padded with x to size bytes (never shorter than the JSON without
// padding). The Go benchmarks of package bench use it too.
func EventBody(id int64, size int) []byte {
	head := fmt.Sprintf(`{"notification_id":"%d","user_id":"user-%d","channel":"email","subject":"Your weekly summary","pad":"`, id, id%100)
	pad := max(size-len(head)-2, 0)
	return []byte(head + strings.Repeat("x", pad) + `"}`)
}

// EventID reads notification_id from an EventBody; the error names what
// does not parse.
func EventID(body []byte) (int64, error) {
	var ev struct {
		NotificationID string `json:"notification_id"`
	}
	if err := json.Unmarshal(body, &ev); err != nil {
		return 0, fmt.Errorf("bench: event body: %w", err)
	}
	id, err := strconv.ParseInt(ev.NotificationID, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("bench: notification_id %q: %w", ev.NotificationID, err)
	}
	return id, nil
}

// uniqueName returns prefix followed by a random hex suffix: names of
// databases, exchanges and queues no earlier run used.
func uniqueName(prefix string) string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}

// database is a fresh, migrated database (outbox, processed_messages and
// the app's notifications table) created for one scenario run and dropped
// after it.
type database struct {
	admin *pgxpool.Pool // a small pool on the database itself
	url   string
	// slot is the replication slot (and publication) of a WAL relay on
	// the database (outbox.DefaultSlotName of its name); close drops it.
	slot string
	drop func()
}

// newDatabase creates database name on the server of serverURL, migrates
// it and returns it. close drops it.
func newDatabase(ctx context.Context, serverURL string) (*database, error) {
	name := uniqueName("ferry_bench")
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return nil, fmt.Errorf("bench: connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("bench: create database %s: %w", name, err)
	}
	u, err := url.Parse(serverURL)
	if err != nil {
		return nil, fmt.Errorf("bench: database URL: %w", err)
	}
	u.Path = "/" + name
	db := &database{url: u.String(), slot: outbox.DefaultSlotName(name)}
	db.drop = func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(dctx, serverURL)
		if err != nil {
			return
		}
		defer c.Close(dctx)
		// A logical replication slot (a WAL relay's) keeps its database
		// from being dropped (WITH (FORCE) too) and the server's WAL from
		// being recycled: end its stream, drop it, then the database,
		// again until it is gone (a stream that is ending holds its
		// slot for a moment).
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			_, _ = c.Exec(dctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = $1 AND active_pid IS NOT NULL`, name)
			_, _ = c.Exec(dctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1 AND NOT active`, name)
			_, err := c.Exec(dctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
			if err == nil || time.Now().After(deadline) || dctx.Err() != nil {
				return
			}
		}
	}
	if db.admin, err = db.pool(ctx, 2); err != nil {
		db.drop()
		return nil, err
	}
	if err := outbox.Migrate(ctx, db.admin); err != nil {
		db.close()
		return nil, err
	}
	if err := app.Migrate(ctx, db.admin); err != nil {
		db.close()
		return nil, err
	}
	return db, nil
}

// pool opens a pool of maxConns connections on the database; see OpenPool.
func (d *database) pool(ctx context.Context, maxConns int) (*pgxpool.Pool, error) {
	return OpenPool(ctx, d.url, maxConns)
}

// OpenPool opens a pool of exactly maxConns connections on the database
// at dsn, all opened at once so a measurement does not include connection
// set-up. The caller closes it. ferry bench and the Watermill module's
// benchmarks share it.
func OpenPool(ctx context.Context, dsn string, maxConns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("bench: database URL: %w", err)
	}
	cfg.MaxConns, cfg.MinConns = int32(maxConns), int32(maxConns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("bench: open pool: %w", err)
	}
	conns := make([]*pgxpool.Conn, 0, maxConns)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range maxConns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			pool.Close()
			return nil, fmt.Errorf("bench: open pool: %w", err)
		}
		conns = append(conns, c)
	}
	return pool, nil
}

func (d *database) close() {
	if d.admin != nil {
		d.admin.Close()
	}
	d.drop()
}

// countSent returns how many business rows are marked sent.
func (d *database) countSent(ctx context.Context) (int64, error) {
	var n int64
	err := d.admin.QueryRow(ctx, `SELECT count(*) FROM notifications WHERE status = 'sent'`).Scan(&n)
	return n, err
}

// unpublished returns the outbox rows not yet published: the outbox lag.
func (d *database) unpublished(ctx context.Context) (int64, error) {
	var n int64
	err := d.admin.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE processed_at IS NULL`).Scan(&n)
	return n, err
}

// produce commits one business row (a pending notification) and its
// outbox event in one transaction, as the sample app's API does, and
// returns the outbox row's id (the message ID).
func produce(ctx context.Context, pool *pgxpool.Pool, size int) (int64, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	id, err := InsertNotification(ctx, tx)
	if err != nil {
		return 0, err
	}
	ev := outbox.Event{Type: EventType, Key: "user-" + strconv.FormatInt(id%100, 10), Body: EventBody(id, size),
		Headers: map[string]string{broker.HeaderTraceparent: traceparent}}
	ids, err := outbox.Enqueue(ctx, tx, ev)
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("bench: commit: %w", err)
	}
	return ids[0], nil
}

// InsertNotification inserts the benchmark's business row in tx: a
// pending e-mail notification of the sample app's table notifications
// (app.Migrate), and returns its id. ferry bench, the Go benchmarks and
// the Watermill module's producers commit it with their event.
func InsertNotification(ctx context.Context, tx pgx.Tx) (int64, error) {
	var id int64
	if err := tx.QueryRow(ctx, `
		INSERT INTO notifications (user_id, channel, to_addr, subject, body)
		VALUES ($1, 'email', 'someone@example.com', 'Your weekly summary', 'Hello!')
		RETURNING id`, "user-bench").Scan(&id); err != nil {
		return 0, fmt.Errorf("bench: insert notification: %w", err)
	}
	return id, nil
}

// produceAll commits n events of size-byte bodies through ferry's outbox
// on pool; see Produce.
func produceAll(ctx context.Context, pool *pgxpool.Pool, n, producers, rate, size int, onCommit func(id int64)) (time.Duration, error) {
	return Produce(ctx, n, producers, rate, func(ctx context.Context) (int64, error) { return produce(ctx, pool, size) }, onCommit)
}

// Produce runs one n times from producers goroutines, at rate calls/s in
// all (a ticker; 0: as fast as they go): one is one producer's
// transaction (a business row and its event) and returns the id it
// committed. onCommit, when set, gets each id just after one returned. It
// returns the time from the start to the last return and the first error
// (a failed call is not repeated; the others go on). ferry bench and the
// Watermill module's benchmarks share it.
func Produce(ctx context.Context, n, producers, rate int, one func(ctx context.Context) (int64, error), onCommit func(id int64)) (time.Duration, error) {
	jobs := make(chan struct{}, min(n, 1<<16))
	go func() {
		defer close(jobs)
		if rate <= 0 {
			for range n {
				select {
				case jobs <- struct{}{}:
				case <-ctx.Done():
					return
				}
			}
			return
		}
		t := time.NewTicker(time.Second / time.Duration(rate))
		defer t.Stop()
		for range n {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				jobs <- struct{}{}
			}
		}
	}()
	var (
		wg      sync.WaitGroup
		errOnce sync.Once
		first   error
	)
	start := time.Now()
	for range producers {
		wg.Go(func() {
			for range jobs {
				id, err := one(ctx)
				if err != nil {
					errOnce.Do(func() { first = err })
					continue
				}
				if onCommit != nil {
					onCommit(id)
				}
			}
		})
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return time.Since(start), first
}

// fillBusiness inserts n pending business rows (ids 1..n on a fresh
// database) and their unpublished outbox events in id order, as produce
// would have committed them, and vacuums both tables: a backlog for the
// relay to drain.
func fillBusiness(ctx context.Context, db *database, n, size int) error {
	bodies := make([][]byte, n)
	for i := range bodies {
		bodies[i] = EventBody(int64(i+1), size)
	}
	if _, err := db.admin.Exec(ctx, `
		INSERT INTO notifications (id, user_id, channel, to_addr, subject, body)
		SELECT g, 'user-bench', 'email', 'someone@example.com', 'Your weekly summary', 'Hello!'
		FROM generate_series(1, $1) g`, n); err != nil {
		return fmt.Errorf("bench: fill notifications: %w", err)
	}
	if _, err := db.admin.Exec(ctx, `SELECT setval(pg_get_serial_sequence('notifications', 'id'), $1)`, n); err != nil {
		return fmt.Errorf("bench: fill notifications: %w", err)
	}
	if _, err := db.admin.Exec(ctx, `
		INSERT INTO outbox (event_type, partition_key, payload, headers)
		SELECT $1, 'user-' || (ord % 100), body, jsonb_build_object('traceparent', $3::text)
		FROM unnest($2::bytea[]) WITH ORDINALITY AS e(body, ord)
		ORDER BY ord`, EventType, bodies, traceparent); err != nil {
		return fmt.Errorf("bench: fill outbox: %w", err)
	}
	if _, err := db.admin.Exec(ctx, `VACUUM ANALYZE outbox, notifications`); err != nil {
		return fmt.Errorf("bench: vacuum: %w", err)
	}
	return nil
}

// DBHandler is the benchmark's worker.Handler: only database work, the
// worker's dedup insert plus one status update of the business row, no
// SMTP, so the figures measure ferry and not a mail server. onHandled,
// when set, is called with the message first.
func DBHandler(onHandled func(msg *broker.Message)) worker.Handler {
	return func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		id, err := EventID(msg.Body)
		if err != nil {
			return worker.Permanent(err)
		}
		if onHandled != nil {
			onHandled(msg)
		}
		_, err = tx.Exec(ctx, `
			UPDATE notifications
			SET status = 'sent', attempts = attempts + 1, sent_at = now(), updated_at = now()
			WHERE id = $1`, id)
		return err
	}
}

// counters are a running pipeline's outcomes.
type counters struct {
	published atomic.Int64 // rows the relay published
	acked     atomic.Int64 // deliveries handled and acked
	dups      atomic.Int64 // deliveries dropped as duplicates
	retried   atomic.Int64 // deliveries retried
	dead      atomic.Int64 // deliveries dead-lettered
}
