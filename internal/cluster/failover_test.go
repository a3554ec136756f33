package cluster

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/kafka"
	"github.com/ferrymq/ferry/brokers/nats"
	"github.com/ferrymq/ferry/brokers/rabbitmq"
	"github.com/ferrymq/ferry/internal/testenv"
)

// TestFailoverNATS: three nats-servers, JetStream streams with 3 replicas
// (the adapter's default on a cluster).
func TestFailoverNATS(t *testing.T) {
	env := up(t, "nats-cluster")
	url := env["FERRY_NATS_CLUSTER_URL"]
	failover(t, system{
		role: "nats-cluster",
		// A JetStream stream leader silent for a few seconds is replaced
		// (Raft election timeout, 4-9 s in nats-server).
		detect: 10 * time.Second,
		open: func(ctx context.Context, log *slog.Logger) (broker.Broker, error) {
			return nats.New(ctx, nats.Config{URL: url, Logger: log})
		},
		leader: natsLeader(url),
	})
}

// TestFailoverRabbitMQ: three RabbitMQ nodes, quorum queues with 3
// replicas (the adapter's default with several URLs).
func TestFailoverRabbitMQ(t *testing.T) {
	env := up(t, "rabbitmq-cluster")
	url := env["FERRY_RABBITMQ_CLUSTER_URL"]
	failover(t, system{
		role: "rabbitmq-cluster",
		// net_ticktime = 10 (cluster.sh): a node is down after 10-14 s.
		detect: 16 * time.Second,
		open: func(ctx context.Context, log *slog.Logger) (broker.Broker, error) {
			return rabbitmq.New(ctx, rabbitmq.Config{URL: url, Logger: log})
		},
		leader: rabbitLeader(strings.Split(env["FERRY_RABBITMQ_CLUSTER_MANAGEMENT_URL"], ",")),
	})
}

// TestFailoverKafka: three KRaft brokers (each a controller too), topics
// with replication factor 3 and min.insync.replicas=2.
func TestFailoverKafka(t *testing.T) {
	env := up(t, "kafka-cluster")
	brokers := strings.Split(env["FERRY_KAFKA_CLUSTER_BROKERS"], ",")
	failover(t, system{
		role: "kafka-cluster",
		// broker.session.timeout.ms=6000 (cluster.sh).
		detect: 10 * time.Second,
		open: func(ctx context.Context, log *slog.Logger) (broker.Broker, error) {
			return kafka.New(ctx, kafka.Config{Brokers: brokers, Logger: log})
		},
		leader: kafkaLeader(brokers),
	})
}

// TestFailoverPostgres: the pipeline on a primary with a synchronous
// standby, through a multi-host URL with target_session_attrs=read-write;
// the primary is killed (SIGKILL) and the standby promoted while the load
// runs. The broker is the single-node RabbitMQ of FERRY_RABBITMQ_URL.
func TestFailoverPostgres(t *testing.T) {
	testenv.RequireTCP(t, "rabbitmq", testenv.HostPort(testenv.RabbitMQURL()))
	env := up(t, "postgres-ha")
	dsn := env["FERRY_DATABASE_HA_URL"]
	require.Contains(t, dsn, "target_session_attrs=read-write")
	pool, err := pgxpool.New(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	rg := newRig(t, pool, func(ctx context.Context, log *slog.Logger) (broker.Broker, error) {
		return rabbitmq.New(ctx, rabbitmq.Config{URL: testenv.RabbitMQURL(), Logger: log})
	}, true)
	rg.run(func() {
		t.Log("kill -9 the primary (node 1), promote the standby (node 2)")
		node(t, "postgres-ha", 1, "kill")
		time.Sleep(time.Second)
		services(t, "promote", "postgres-ha")
	})
}
