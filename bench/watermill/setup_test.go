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
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferrymq/ferry/app"
	"github.com/ferrymq/ferry/bench/suite"
	"github.com/ferrymq/ferry/internal/runcost"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

const (
	// forwarderTopic is the watermill-sql topic (table
	// watermill_<topic>) the producers write and the forwarder polls.
	forwarderTopic = "events_forwarder"
	consumerName   = "bench"
)

// profile is one Watermill configuration.
type profile struct {
	name string
	// pollInterval is watermill-sql's SubscriberConfig.PollInterval
	// (0: its default, 1 s).
	pollInterval time.Duration
	// confirm is watermill-amqp's Publish.ConfirmDelivery (default off).
	confirm bool
	// channelPool is Publish.ChannelPoolSize (0: default, a new channel
	// per Publish).
	channelPool int
	// prefetch is Consume.Qos.PrefetchCount (NewDurableQueueConfig: 1).
	prefetch int
	// consumers is how many subscriptions consume the queue at once, each
	// handling one message at a time (a Watermill subscription's
	// messages are handled in order: the next after the ack).
	consumers int
}

// profiles: Watermill's defaults (NewDurableQueueConfig, the SQL
// subscriber's defaults, one consumer) and the tuned settings of issue 10.
var profiles = []profile{
	{name: "defaults", prefetch: 1, consumers: 1},
	{name: "tuned", pollInterval: 10 * time.Millisecond, confirm: true, channelPool: 1, prefetch: 16, consumers: 4},
}

func (p profile) String() string {
	poll := p.pollInterval.String()
	if p.pollInterval == 0 {
		poll = "default 1s"
	}
	return fmt.Sprintf("watermill %s: sql PollInterval=%s SubscribeBatchSize=default 100; amqp ConfirmDelivery=%v ChannelPoolSize=%d Prefetch=%d; %d consumers",
		p.name, poll, p.confirm, p.channelPool, p.prefetch, p.consumers)
}

// settings are bench's variables that apply here.
type settings struct {
	events, producers int
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

func amqpConfig(p profile) wamqp.Config {
	cfg := wamqp.NewDurableQueueConfig(testenv.RabbitMQURL())
	cfg.Publish.ConfirmDelivery = p.confirm
	cfg.Publish.ChannelPoolSize = p.channelPool
	cfg.Consume.Qos.PrefetchCount = p.prefetch
	return cfg
}

// newQueue returns a unique AMQP topic (queue name), deleted when the
// benchmark ends.
func newQueue(b *testing.B) string {
	q := testenv.UniqueName("wmbench")
	b.Cleanup(func() {
		conn, err := amqp.Dial(testenv.RabbitMQURL())
		if err != nil {
			b.Logf("watermill bench: delete queue %s: %v", q, err)
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			b.Logf("watermill bench: delete queue %s: %v", q, err)
			return
		}
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			b.Logf("watermill bench: delete queue %s: %v", q, err)
		}
	})
	return q
}

// produce commits one business row and its event in one transaction, the
// way Watermill documents its outbox: watermill-sql's publisher on the
// transaction, wrapped by the forwarder's publisher (which envelopes the
// message with its destination topic). It returns the business row's id.
func produce(ctx context.Context, pool *pgxpool.Pool, topic string) (int64, error) {
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
	msg := message.NewMessage(watermill.NewUUID(), suite.EventBody(id, suite.DefaultSize))
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

// burst commits n events from producers goroutines as fast as they go
// (suite.Produce, ferry bench's producers) and returns the elapsed time
// and the first error.
func burst(ctx context.Context, pool *pgxpool.Pool, topic string, producers, n int) (time.Duration, error) {
	return suite.Produce(ctx, n, producers, 0, func(ctx context.Context) (int64, error) { return produce(ctx, pool, topic) }, nil)
}

// pipeline is a forwarder and consumers running on one database and
// queue.
type pipeline struct {
	acked, dups, failed atomic.Int64
	done                chan struct{}
	stop                func()
}

// startPipeline starts the forwarder (watermill-sql subscriber on its own
// pool into a watermill-amqp publisher) and p.consumers watermill-amqp
// subscriptions, whose handler, in one transaction, inserts the message's
// UUID into processed_messages (a duplicate is acked without effect) and
// marks the business row sent; then acks.
func startPipeline(b *testing.B, db database, topic string, p profile, target int64, onHandled func(id int64)) *pipeline {
	b.Helper()
	ctx, cancel := context.WithCancel(benchCtx(b))
	pl := &pipeline{done: make(chan struct{})}

	fwdPool := db.newPool(b, 2)
	sqlSub, err := newSQLSubscriber(fwdPool, p)
	must(b, err)
	amqpPub, err := wamqp.NewPublisher(amqpConfig(p), logger)
	must(b, err)
	fwd, err := forwarder.NewForwarder(sqlSub, amqpPub, logger, forwarder.Config{ForwarderTopic: forwarderTopic})
	must(b, err)

	conPool := db.newPool(b, p.consumers+2)
	amqpSub, err := wamqp.NewSubscriber(amqpConfig(p), logger)
	must(b, err)
	must(b, amqpSub.SubscribeInitialize(topic))

	var wg sync.WaitGroup
	fwdErr := make(chan error, 1)
	go func() { fwdErr <- fwd.Run(ctx) }()
	select {
	case <-fwd.Running():
	case err := <-fwdErr:
		b.Fatalf("watermill bench: forwarder: %v", err)
	}
	for range p.consumers {
		msgs, err := amqpSub.Subscribe(ctx, topic)
		must(b, err)
		wg.Go(func() {
			for msg := range msgs {
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
			must(b, amqpSub.Close())
			wg.Wait()
			must(b, amqpPub.Close())
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
// PostgreSQL and RabbitMQ (withBroker), WAL and commits.
func startCost(b *testing.B, db database, withBroker bool) *runcost.Meter {
	b.Helper()
	ctx := benchCtx(b)
	pg, err := runcost.Postgres(ctx, db.pool)
	must(b, err)
	procs := []runcost.Process{runcost.Self("app"), pg}
	if withBroker {
		p, err := runcost.Listener("rabbitmq", testenv.RabbitMQURL())
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
