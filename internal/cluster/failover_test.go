package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/alert"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/kafka"
	"github.com/ferrymq/ferry/brokers/nats"
	"github.com/ferrymq/ferry/brokers/rabbitmq"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// TestFailoverNATS: three nats-servers, JetStream streams with 3 replicas
// (the adapter's default on a cluster).
func TestFailoverNATS(t *testing.T) {
	env := up(t, "nats-cluster")
	nodes, err := NodesFromEnv("nats", env)
	require.NoError(t, err)
	url := env["FERRY_NATS_CLUSTER_URL"]
	failover(t, system{
		role: "nats-cluster",
		// A JetStream stream leader silent for a few seconds is replaced
		// (Raft election timeout, 4-9 s in nats-server).
		detect: 10 * time.Second,
		open: func(ctx context.Context, log *slog.Logger) (broker.Broker, error) {
			return nats.New(ctx, nats.Config{URL: url, Logger: log})
		},
		leader:         leaderOf(nodes),
		consumerLeader: consumerLeaderOf(nodes),
	})
}

// TestFailoverRabbitMQ: three RabbitMQ nodes, quorum queues with 3
// replicas (the adapter's default with several URLs).
func TestFailoverRabbitMQ(t *testing.T) {
	// A cluster of its own from scratch: RabbitMQ nodes restarted from data
	// that a failed run left behind may wait for each other's Mnesia
	// tables (the last node stopped must start first).
	services(t, "reset", "rabbitmq-cluster")
	env := up(t, "rabbitmq-cluster")
	url := env["FERRY_RABBITMQ_CLUSTER_URL"]
	nodes, err := NodesFromEnv("rabbitmq", env)
	require.NoError(t, err)
	failover(t, system{
		role: "rabbitmq-cluster",
		// net_ticktime = 10 (cluster.sh): a node is down after 10-14 s.
		detect: 16 * time.Second,
		open: func(ctx context.Context, log *slog.Logger) (broker.Broker, error) {
			return rabbitmq.New(ctx, rabbitmq.Config{URL: url, Logger: log})
		},
		leader: leaderOf(nodes),
	})
}

// TestFailoverKafka: three KRaft brokers (each a controller too), topics
// with replication factor 3 and min.insync.replicas=2.
func TestFailoverKafka(t *testing.T) {
	env := up(t, "kafka-cluster")
	nodes, err := NodesFromEnv("kafka", env)
	require.NoError(t, err)
	brokers := nodes.URLs
	failover(t, system{
		role: "kafka-cluster",
		// broker.session.timeout.ms=6000 (cluster.sh).
		detect: 10 * time.Second,
		open: func(ctx context.Context, log *slog.Logger) (broker.Broker, error) {
			return kafka.New(ctx, kafka.Config{Brokers: brokers, Logger: log})
		},
		leader: leaderOf(nodes),
	})
}

// TestFailoverPostgres: the pipeline on a primary with a synchronous
// standby, through a multi-host URL with target_session_attrs=read-write;
// the primary is killed (SIGKILL) and the standby promoted while the load
// runs. The broker is the single-node RabbitMQ of FERRY_RABBITMQ_URL.
func TestFailoverPostgres(t *testing.T) {
	testenv.RequireTCP(t, "rabbitmq", testenv.HostPort(testenv.RabbitMQURL()))
	services(t, "reset", "postgres-ha") // a pair of its own, whatever an earlier run left
	env := up(t, "postgres-ha")
	// After a promotion the old primary's data has diverged: the pair is
	// built again from scratch by the next up.
	t.Cleanup(func() { services(t, "reset", "postgres-ha") })
	dsn := env["FERRY_DATABASE_HA_URL"]
	require.Contains(t, dsn, "target_session_attrs=read-write")
	pool, err := pgxpool.New(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	rg := newRig(t, pool, func(ctx context.Context, log *slog.Logger) (broker.Broker, error) {
		return rabbitmq.New(ctx, rabbitmq.Config{URL: testenv.RabbitMQURL(), Logger: log})
	}, true)
	// The alert leader (a session-level advisory lock on a connection of
	// its own, see package alert) leads before the fault.
	ctx := context.Background()
	al, err := alert.New(alert.Config{Pool: pool, Interval: 200 * time.Millisecond,
		Source: func(ctx context.Context) (int, time.Duration, error) {
			var n int
			err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE processed_at IS NULL`).Scan(&n)
			return n, 0, err
		}, Logger: slog.New(slog.NewTextHandler(rg.logs, nil))})
	require.NoError(t, err)
	t.Cleanup(func() { _ = al.Close() })
	al.Check(ctx)
	require.True(t, al.Leading(), "the only alert instance leads")

	rg.run(func(mark func()) {
		t.Log("kill -9 the primary (node 1), promote the standby (node 2)")
		node(t, "postgres-ha", 1, "kill")
		mark() // the node is gone: what is enqueued from now on needs the failover
		time.Sleep(time.Second)
		services(t, "promote", "postgres-ha")
	})

	// Every connection now is on node 2, the promoted primary.
	var port int
	require.NoError(t, pool.QueryRow(ctx, `SELECT inet_server_port()`).Scan(&port))
	require.Contains(t, dsn, fmt.Sprintf(",127.0.0.1:%d/", port), "the pool is on the promoted standby")
	// The alert takes the lead again there: its check finds the lock's
	// connection dead and takes the lock on the new primary (bounded, so
	// that a leader that never comes back fails instead of hanging).
	for i := 0; ; i++ {
		al.Check(ctx)
		var locks int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::bigint::oid AND granted`,
			int64(alert.LockClassID)).Scan(&locks))
		if locks == 1 && al.Leading() {
			break
		}
		require.Less(t, i, 300, "the alert did not take its leader lock on the new primary")
		time.Sleep(100 * time.Millisecond)
	}
	// The relay LISTENs on the new primary: its wake-ups work again.
	var listening int
	for i := 0; listening == 0; i++ {
		require.Less(t, i, 300, "the relay does not LISTEN on the new primary")
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN ' || $1`, outbox.NotifyChannel).Scan(&listening))
		time.Sleep(100 * time.Millisecond)
	}
}
