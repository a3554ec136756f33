package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/alert"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/kafka"
	"github.com/ferrymq/ferry/brokers/nats"
	"github.com/ferrymq/ferry/brokers/rabbitmq"
	"github.com/ferrymq/ferry/internal/roomtest"
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
	t.Run("no-room", func(t *testing.T) { kafkaNoRoom(t, brokers) })
}

// kafkaNoRoom is the Kafka case of issue 29's "no room on the broker" on
// the 3-broker cluster: a topology of its own whose topics have 3
// replicas and min.insync.replicas=3, then one broker killed. Once the
// controller takes it out of the in-sync replicas (its 6 s session
// timeout), every partition's leader refuses acks=all writes with
// NOT_ENOUGH_REPLICAS, which the adapter reports as broker.ErrBlocked:
// the relay says it is blocked, once, holds its rows and publishes them
// all once the broker is back in sync (roomtest.Run). The relay's
// PublishTimeout is 1 s: the adapter sends a produce refused with
// NOT_ENOUGH_REPLICAS again until the Publish's ctx ends, so each failed
// batch takes that long. A single broker with a replication factor of 1
// never refuses this way, so it is tested here.
func kafkaNoRoom(t *testing.T, brokers []string) {
	services(t, "up", "kafka-cluster")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	b, err := kafka.New(ctx, kafka.Config{Brokers: brokers, ReplicationFactor: 3})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	base := testenv.UniqueName("room")
	tp := broker.Topology{Exchange: base + ".ex", Queues: []broker.Queue{{Name: base + ".work", Bindings: []string{"evt.room"}}}}
	require.NoError(t, b.Declare(ctx, tp))
	admin := &kafkago.Client{Addr: kafkago.TCP(brokers...), Timeout: 10 * time.Second}
	res, err := admin.IncrementalAlterConfigs(ctx, &kafkago.IncrementalAlterConfigsRequest{Resources: []kafkago.IncrementalAlterConfigsRequestResource{{
		ResourceType: kafkago.ResourceTypeTopic, ResourceName: kafka.TopicName(tp.Exchange),
		Configs: []kafkago.IncrementalAlterConfigsRequestConfig{{Name: "min.insync.replicas", Value: "3", ConfigOperation: kafkago.ConfigOperationSet}}}}})
	require.NoError(t, err)
	for _, r := range res.Resources {
		require.NoError(t, r.Error, "min.insync.replicas=3 on %s", r.ResourceName)
	}
	const killed = 3
	r := roomtest.Run(t, roomtest.Case{
		Broker: b, Topology: tp, Type: "evt.room", Reason: "Not Enough Replicas", PublishTimeout: time.Second,
		Block: func(t *testing.T) {
			t.Logf("kill -9 broker %d: 2 in-sync replicas left, min.insync.replicas 3", killed)
			node(t, "kafka-cluster", killed, "kill")
		},
		Unblock: func(t *testing.T) { node(t, "kafka-cluster", killed, "start") },
	})
	t.Logf("NO-ROOM kafka: reason %q, blocked after %v, resumed %v after the broker's start", r.Reason, r.ToBlocked.Round(time.Millisecond), r.ToResume.Round(time.Millisecond))
}

// TestFailoverPostgres: the pipeline on a primary with a synchronous
// standby, through a multi-host URL with target_session_attrs=read-write;
// the primary is killed (SIGKILL) and the standby promoted while the load
// runs. The broker is the single-node RabbitMQ of FERRY_RABBITMQ_URL.
func TestFailoverPostgres(t *testing.T) { failoverPostgres(t, false) }

// TestFailoverPostgresWAL is TestFailoverPostgres with the relay in WAL
// mode. Its logical slot is not replicated (PostgreSQL 15): the promoted
// standby has the slot's registration and no slot, on a new timeline, so
// the relay recovers by itself (hands the rows left to the polling side,
// creates a new slot) and streams again from the new primary.
func TestFailoverPostgresWAL(t *testing.T) { failoverPostgres(t, true) }

func failoverPostgres(t *testing.T, wal bool) {
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
	var opts []func(*outbox.RelayConfig)
	slot := outbox.DefaultSlotName(outbox.DefaultDestination)
	if wal {
		opts = append(opts, func(c *outbox.RelayConfig) { c.Mode = outbox.RelayModeWAL })
	}
	rg := newRig(t, pool, func(ctx context.Context, log *slog.Logger) (broker.Broker, error) {
		return rabbitmq.New(ctx, rabbitmq.Config{URL: testenv.RabbitMQURL(), Logger: log})
	}, true, opts...)
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

	var (
		promotedAt time.Time
		streaming  = make(chan time.Duration, 1) // promote to the slot streamed on the new primary
	)
	rg.run(func(mark func()) {
		t.Log("kill -9 the primary (node 1), promote the standby (node 2)")
		node(t, "postgres-ha", 1, "kill")
		mark() // the node is gone: what is enqueued from now on needs the failover
		time.Sleep(time.Second)
		services(t, "promote", "postgres-ha")
		promotedAt = time.Now()
		if wal {
			go func() {
				defer close(streaming)
				for time.Since(promotedAt) < 2*time.Minute {
					s, err := outbox.ReadWALStats(ctx, pool, slot, "")
					if err == nil && s.Active {
						streaming <- time.Since(promotedAt)
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
			}()
		}
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
	if wal {
		// The relay recovered the slot by itself on the new timeline, once,
		// and streams from it.
		d, ok := <-streaming
		require.True(t, ok, "the WAL relay does not stream from the new primary within 2 minutes of the promote")
		var sameTL bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT timeline_id = ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint FROM outbox_wal_slots WHERE slot_name = $1`, slot).Scan(&sameTL))
		require.True(t, sameTL, "the slot is registered on the new primary's timeline")
		logs := rg.logs.String()
		require.Equal(t, 1, strings.Count(logs, "lost by a failover"), "one recovery of the slot")
		handed := "?"
		if m := regexp.MustCompile(`lost by a failover.*old_timeline=(\d+) new_timeline=(\d+).*handed_to_polling=(\d+)`).FindStringSubmatch(logs); m != nil {
			handed = fmt.Sprintf("%s (timeline %s to %s)", m[3], m[1], m[2])
		}
		t.Logf("RESULT %s: wal slot streamed on the new primary %v after the promote; rows handed to the polling side %s", t.Name(), d.Round(time.Millisecond), handed)
		return
	}
	// The relay LISTENs on the new primary: its wake-ups work again.
	var listening int
	for i := 0; listening == 0; i++ {
		require.Less(t, i, 300, "the relay does not LISTEN on the new primary")
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN ' || $1`, outbox.NotifyChannel).Scan(&listening))
		time.Sleep(100 * time.Millisecond)
	}
}
