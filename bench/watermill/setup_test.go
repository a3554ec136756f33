package watermill

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferrymq/ferry/app"
	"github.com/ferrymq/ferry/bench/suite"
	"github.com/ferrymq/ferry/internal/runcost"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// forwarderTopic is the watermill-sql topic (table
// watermill_<topic>) the producers write and the forwarder polls;
// consumerName is the consumer's name in processed_messages.
const (
	forwarderTopic = "events_forwarder"
	consumerName   = "bench"
)

// settings are bench's variables that apply here.
type settings struct {
	events, producers int
	size              int // event body in bytes
	latencyEvents     int
	latencyRates      []int
}

func loadSettings(b *testing.B) settings {
	envInt := func(name string, def int) int {
		v := os.Getenv(name)
		if v == "" {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			b.Fatalf("watermill bench: %s=%q: want a positive integer", name, v)
		}
		return n
	}
	s := settings{
		events:        envInt("FERRY_BENCH_EVENTS", 20000),
		producers:     envInt("FERRY_BENCH_PRODUCERS", 4),
		size:          envInt("FERRY_BENCH_SIZE", suite.DefaultSize),
		latencyEvents: envInt("FERRY_BENCH_LATENCY_EVENTS", 1<<30),
		latencyRates:  []int{200, 1000},
	}
	if s.latencyEvents == 1<<30 {
		s.latencyEvents = 0
	}
	if v := os.Getenv("FERRY_BENCH_LATENCY_RATE"); v != "" {
		s.latencyRates = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				b.Fatalf("watermill bench: FERRY_BENCH_LATENCY_RATE=%q: want positive integers separated by commas", v)
			}
			s.latencyRates = append(s.latencyRates, n)
		}
	}
	return s
}

// logger drops Watermill's info and debug lines; warnings and errors
// still show.
var logger = watermill.NewSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))

func benchCtx(b *testing.B) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	b.Cleanup(cancel)
	return ctx
}

func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

// database is a fresh database with the app's notifications table,
// ferry's processed_messages (the same dedup table and index the worker
// uses) and watermill-sql's forwarder tables.
type database struct {
	pool *pgxpool.Pool
	dsn  string
}

func newDatabase(b *testing.B) database {
	b.Helper()
	ctx := benchCtx(b)
	pool, dsn := testenv.NewPool(b)
	must(b, outbox.Migrate(ctx, pool)) // processed_messages (the outbox table stays empty)
	must(b, app.Migrate(ctx, pool))
	sub, err := newSQLSubscriber(pool, profile{})
	must(b, err)
	must(b, sub.SubscribeInitialize(forwarderTopic))
	must(b, sub.Close())
	return database{pool: pool, dsn: dsn}
}

// newPool opens a pool of maxConns connections on the database, all
// opened now (suite.OpenPool), closed when the benchmark ends.
func (d database) newPool(b *testing.B, maxConns int) *pgxpool.Pool {
	b.Helper()
	pool, err := suite.OpenPool(benchCtx(b), d.dsn, maxConns)
	must(b, err)
	b.Cleanup(pool.Close)
	return pool
}

func newSQLSubscriber(pool *pgxpool.Pool, p profile) (*wsql.Subscriber, error) {
	return wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), wsql.SubscriberConfig{
		SchemaAdapter:    wsql.DefaultPostgreSQLSchema{},
		OffsetsAdapter:   wsql.DefaultPostgreSQLOffsetsAdapter{},
		PollInterval:     p.pollInterval,
		InitializeSchema: true,
	}, logger)
}

// produce commits one business row and its event in one transaction, the
// way Watermill documents its outbox: watermill-sql's publisher on the
// transaction, wrapped by the forwarder's publisher (which envelopes the
// message with its destination topic); the event's body is size bytes.
// It returns the business row's id.
func produce(ctx context.Context, pool *pgxpool.Pool, topic string, size int) (int64, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	id, err := suite.InsertNotification(ctx, tx)
	if err != nil {
		return 0, err
	}
	sqlPub, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}}, logger)
	if err != nil {
		return 0, err
	}
	// The event is ferry bench's (suite.EventBody, suite.Traceparent).
	msg := message.NewMessage(watermill.NewUUID(), suite.EventBody(id, size))
	msg.Metadata.Set("traceparent", suite.Traceparent)
	msg.Metadata.Set("created_at", time.Now().UTC().Format(time.RFC3339Nano))
	if err := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: forwarderTopic}).Publish(topic, msg); err != nil {
		return 0, fmt.Errorf("publish: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("commit: %w", err)
	}
	return id, nil
}

// burst commits n events from s.producers goroutines as fast as they go
// (suite.Produce, ferry bench's producers) and returns the elapsed time
// and the first error.
func burst(ctx context.Context, pool *pgxpool.Pool, topic string, s settings, n int) (time.Duration, error) {
	return suite.Produce(ctx, n, s.producers, 0, func(ctx context.Context) (int64, error) { return produce(ctx, pool, topic, s.size) }, nil)
}

// pipeline is a forwarder and consumers running on one database and
// topic.
type pipeline struct {
	acked, dups, failed atomic.Int64
	done                chan struct{}
	stop                func()
}

// startPipeline starts the forwarder (a watermill-sql subscriber on its
// own pool into p's broker publisher) and p's subscriptions, which
// handle each message in a goroutine of its own, as Watermill's Router
// does (how many run at once is the Pub/Sub's: a subscription hands out
// its next message after the ack). The handler, in one transaction,
// inserts the message's UUID into processed_messages (a duplicate is
// acked without effect) and marks the business row sent; then acks.
func startPipeline(b *testing.B, db database, topic string, p profile, target int64, onHandled func(id int64)) *pipeline {
	b.Helper()
	ctx, cancel := context.WithCancel(benchCtx(b))
	pl := &pipeline{done: make(chan struct{})}

	fwdPool := db.newPool(b, 2)
	sqlSub, err := newSQLSubscriber(fwdPool, p)
	must(b, err)
	pub, err := p.ps.publisher()
	must(b, err)
	fwd, err := forwarder.NewForwarder(sqlSub, pub, logger, forwarder.Config{ForwarderTopic: forwarderTopic})
	must(b, err)

	conPool := db.newPool(b, p.ps.inFlight()+2)
	sub, err := p.ps.subscriber(topic)
	must(b, err)
	si, ok := sub.(message.SubscribeInitializer)
	if !ok {
		b.Fatalf("watermill bench: %T has no SubscribeInitialize", sub)
	}
	must(b, si.SubscribeInitialize(topic))

	var wg sync.WaitGroup
	fwdErr := make(chan error, 1)
	go func() { fwdErr <- fwd.Run(ctx) }()
	select {
	case <-fwd.Running():
	case err := <-fwdErr:
		b.Fatalf("watermill bench: forwarder: %v", err)
	}
	consume := func(msg *message.Message) {
		dup, err := handle(ctx, conPool, msg, onHandled)
		switch {
		case err != nil:
			if ctx.Err() == nil {
				pl.failed.Add(1)
				b.Logf("watermill bench: handler: %v", err)
			}
			msg.Nack()
		case dup:
			pl.dups.Add(1)
			msg.Ack()
		default:
			msg.Ack()
			if pl.acked.Add(1) == target {
				close(pl.done)
			}
		}
	}
	for range p.ps.subscriptions() {
		msgs, err := sub.Subscribe(ctx, topic)
		must(b, err)
		wg.Go(func() {
			var handlers sync.WaitGroup
			for msg := range msgs {
				handlers.Go(func() { consume(msg) })
			}
			handlers.Wait()
		})
	}
	var once sync.Once
	pl.stop = func() {
		once.Do(func() {
			// The forwarder first, without cancelling its in-flight
			// poll (which would log a failed ack of its batch).
			must(b, fwd.Close())
			if err := <-fwdErr; err != nil {
				b.Errorf("watermill bench: forwarder: %v", err)
			}
			cancel()
			must(b, sub.Close())
			wg.Wait()
			must(b, pub.Close())
			fwdPool.Close()
			conPool.Close()
		})
	}
	b.Cleanup(pl.stop)
	return pl
}

// handle is the consumer's work, bench's handler plus the dedup insert
// ferry's worker does: one transaction.
func handle(ctx context.Context, pool *pgxpool.Pool, msg *message.Message, onHandled func(id int64)) (dup bool, err error) {
	id, err := suite.EventID(msg.Payload)
	if err != nil {
		return false, err
	}
	if onHandled != nil {
		onHandled(id)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`, consumerName, msg.UUID)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			dup = true
			return nil
		}
		_, err = tx.Exec(ctx, `
			UPDATE notifications
			SET status = 'sent', attempts = attempts + 1, sent_at = now(), updated_at = now()
			WHERE id = $1`, id)
		return err
	})
	return dup, err
}

func (pl *pipeline) wait(b *testing.B, timeout time.Duration) {
	b.Helper()
	select {
	case <-pl.done:
	case <-time.After(timeout):
		b.Fatalf("watermill bench: only %d events handled (%d duplicates, %d failed) after %v", pl.acked.Load(), pl.dups.Load(), pl.failed.Load(), timeout)
	}
}

func countSent(b *testing.B, db database) int64 {
	var n int64
	must(b, db.pool.QueryRow(benchCtx(b), `SELECT count(*) FROM notifications WHERE status = 'sent'`).Scan(&n))
	return n
}

// startCost and stopCost are bench's: CPU of this process ("app"),
// PostgreSQL and, when broker is set, the broker's server (named by
// broker.name), WAL and commits.
func startCost(b *testing.B, db database, broker *peerBroker) *runcost.Meter {
	b.Helper()
	ctx := benchCtx(b)
	pg, err := runcost.Postgres(ctx, db.pool)
	must(b, err)
	procs := []runcost.Process{runcost.Self("app"), pg}
	if broker != nil {
		p, err := runcost.Listener(broker.name, broker.server())
		must(b, err)
		procs = append(procs, p)
	}
	m, err := runcost.Start(ctx, db.pool, procs...)
	must(b, err)
	return m
}

func stopCost(b *testing.B, m *runcost.Meter, db database, events int, prefix string) string {
	b.Helper()
	c, err := m.Stop(benchCtx(b), db.pool)
	must(b, err)
	return c.Report(events, prefix, b.ReportMetric)
}

// logStatements is bench's: with FERRY_BENCH_STATEMENTS=1, what the run
// on db executed, per event, from pg_stat_statements.
func logStatements(b *testing.B, db database, events int, label string) {
	b.Helper()
	if os.Getenv("FERRY_BENCH_STATEMENTS") != "1" {
		return
	}
	lines, err := runcost.StatementsOf(benchCtx(b), testenv.DatabaseURL(), db.pool, events, 25)
	must(b, err)
	// Printed, not logged: a benchmark's log is cut at 10 lines.
	fmt.Printf("%s: statements (pg_stat_statements, most total time first):\n\t%s\n", label, strings.Join(lines, "\n\t"))
}

func machineLoad() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Fields(string(b))[0]
}
