package kafka_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/kafka"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/worker"
	"github.com/ferrymq/ferry/worker/workertest"
)

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func topology(prefix string, delays ...time.Duration) broker.Topology {
	base := testenv.UniqueName(prefix)
	return broker.Topology{Exchange: base + ".ex", Queues: []broker.Queue{{Name: base + ".work", Bindings: []string{"evt.#"}, RetryDelays: delays}}}
}

// declared returns a new broker with tp declared; tp's topics are deleted
// when the test ends.
func declared(t *testing.T, tp broker.Topology) broker.Broker {
	t.Helper()
	b := newBroker(t)
	require.NoError(t, b.Declare(ctxFor(t, 30*time.Second), tp))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		deleteTopology(ctx, t, tp)
	})
	return b
}

func subscribe(t *testing.T, b broker.Broker, queue string, opts broker.SubscribeOptions) broker.Subscription {
	t.Helper()
	sub, err := b.Subscribe(ctxFor(t, 10*time.Second), queue, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

func receive(t *testing.T, sub broker.Subscription, d time.Duration) broker.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	dl, err := sub.Receive(ctx)
	require.NoError(t, err)
	return dl
}

func receiveNone(t *testing.T, sub broker.Subscription, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	dl, err := sub.Receive(ctx)
	if err == nil {
		t.Fatalf("expected nothing within %v, got %s attempt %d", d, dl.Message().ID, dl.Message().Attempt)
	}
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// keyFor returns a key that the adapter's partitioner (murmur2, as Java
// clients) puts on partition p of 3.
func keyFor(t *testing.T, p int) string {
	for i := 0; i < 1000; i++ {
		k := fmt.Sprintf("key-%d", i)
		if (&kafkago.Murmur2Balancer{}).Balance(kafkago.Message{Key: []byte(k)}, 0, 1, 2) == p {
			return k
		}
	}
	t.Fatalf("no key for partition %d", p)
	return ""
}

// A failed message in the middle of a partition is never skipped: three
// messages of one key (one partition), the handler fails the second only.
// First a crash with the second unsettled and the third acked: after the
// restart the second comes again (the commit stopped before it). Then it
// is retried and handled; after another restart nothing comes back and
// nothing is missing.
func TestFailedMiddleMessageNotSkipped(t *testing.T) {
	t.Parallel()
	tp := topology("kafka-middle", 200*time.Millisecond)
	q := tp.Queues[0].Name
	b1 := declared(t, tp)
	var msgs []*broker.Message
	for i := 1; i <= 3; i++ {
		msgs = append(msgs, &broker.Message{ID: fmt.Sprint("m", i), Type: "evt.x", Key: "same", Body: []byte("x")})
	}
	require.NoError(t, b1.Publish(ctxFor(t, 10*time.Second), msgs))

	sub1 := subscribe(t, b1, q, broker.SubscribeOptions{Prefetch: 10})
	got := map[string]broker.Delivery{}
	for range 3 {
		d := receive(t, sub1, 20*time.Second)
		got[d.Message().ID] = d
	}
	require.NoError(t, got["m1"].Ack(ctxFor(t, 5*time.Second)))
	require.NoError(t, got["m3"].Ack(ctxFor(t, 5*time.Second)))
	time.Sleep(1500 * time.Millisecond) // commits happen meanwhile
	require.NoError(t, b1.Close())      // crash: m2 never settled

	b2 := declared(t, tp)
	sub2 := subscribe(t, b2, q, broker.SubscribeOptions{Prefetch: 10})
	seen := map[string]broker.Delivery{}
	for {
		d := receive(t, sub2, 20*time.Second)
		seen[d.Message().ID] = d
		if d.Message().ID == "m2" {
			break
		}
	}
	require.NotContains(t, seen, "m1", "m1 was committed before the crash")
	for id, d := range seen {
		if id == "m2" {
			require.NoError(t, d.Retry(ctxFor(t, 10*time.Second), 0, "fails once more"))
			continue
		}
		require.NoError(t, d.Ack(ctxFor(t, 5*time.Second)))
	}
	for {
		d := receive(t, sub2, 20*time.Second)
		if d.Message().ID != "m2" {
			require.Equal(t, "m3", d.Message().ID, "only m3 (after m2 in the partition) may come again")
			require.NoError(t, d.Ack(ctxFor(t, 5*time.Second)))
			continue
		}
		require.Equal(t, 2, d.Message().Attempt, "the retried m2")
		require.NoError(t, d.Ack(ctxFor(t, 5*time.Second)))
		break
	}
	time.Sleep(1500 * time.Millisecond)
	require.NoError(t, sub2.Close())
	time.Sleep(500 * time.Millisecond)
	require.NoError(t, b2.Close())

	b3 := declared(t, tp)
	sub3 := subscribe(t, b3, q, broker.SubscribeOptions{})
	receiveNone(t, sub3, 5*time.Second)
}

// A group that consumed partitions 0 and 1 restarts after messages arrive
// on partition 2, which never had a commit: they are handled too (a
// partition without a committed offset starts at its earliest offset).
func TestNewPartitionAfterRestart(t *testing.T) {
	t.Parallel()
	tp := topology("kafka-p2")
	q := tp.Queues[0].Name
	b1 := declared(t, tp)
	k0, k1, k2 := keyFor(t, 0), keyFor(t, 1), keyFor(t, 2)
	require.NoError(t, b1.Publish(ctxFor(t, 10*time.Second), []*broker.Message{
		{ID: "a", Type: "evt.a", Key: k0}, {ID: "b", Type: "evt.a", Key: k1},
	}))
	sub := subscribe(t, b1, q, broker.SubscribeOptions{})
	for range 2 {
		require.NoError(t, receive(t, sub, 20*time.Second).Ack(ctxFor(t, 5*time.Second)))
	}
	time.Sleep(1500 * time.Millisecond)
	require.NoError(t, sub.Close())
	time.Sleep(500 * time.Millisecond)
	require.NoError(t, b1.Close())

	b2 := declared(t, tp)
	require.NoError(t, b2.Publish(ctxFor(t, 10*time.Second), []*broker.Message{
		{ID: "c", Type: "evt.a", Key: k2}, {ID: "d", Type: "evt.a", Key: k2}, {ID: "e", Type: "evt.a", Key: k0},
	}))
	sub2 := subscribe(t, b2, q, broker.SubscribeOptions{})
	var ids []string
	for range 3 {
		d := receive(t, sub2, 20*time.Second)
		ids = append(ids, d.Message().ID)
		require.NoError(t, d.Ack(ctxFor(t, 5*time.Second)))
	}
	require.ElementsMatch(t, []string{"c", "d", "e"}, ids)
	receiveNone(t, sub2, 2*time.Second)
}

// Per-key order: 1,000 events over 50 keys (in runs of 4 events of one key,
// so a key's events are in flight together), 4 concurrent receivers with
// handlers of random duration. With Ordered every key is handled in
// publish order; without it the test counts (and logs) the violations.
func TestPerKeyOrder(t *testing.T) {
	t.Parallel()
	run := func(t *testing.T, ordered bool) int {
		tp := topology("kafka-order")
		b := declared(t, tp)
		const n, keys = 1000, 50
		var msgs []*broker.Message
		for i := range n {
			msgs = append(msgs, &broker.Message{ID: strconv.Itoa(i), Type: "evt.o", Key: fmt.Sprint("user-", (i/4)%keys), Body: []byte(strconv.Itoa(i))})
		}
		for i := 0; i < n; i += 100 {
			require.NoError(t, b.Publish(ctxFor(t, 30*time.Second), msgs[i:i+100]))
		}
		sub := subscribe(t, b, tp.Queues[0].Name, broker.SubscribeOptions{Prefetch: 20, Ordered: ordered})
		var (
			mu         sync.Mutex
			last       = map[string]int{}
			handled    int
			violations int
			wg         sync.WaitGroup
		)
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					d, err := sub.Receive(ctx)
					if err != nil {
						return
					}
					m := d.Message()
					seq, _ := strconv.Atoi(m.ID)
					// The handler's side effect happens at its end: that is
					// the order a user sees.
					time.Sleep(time.Duration(rand.IntN(1500)) * time.Microsecond)
					mu.Lock()
					if prev, ok := last[m.Key]; ok && seq < prev {
						violations++
					}
					last[m.Key] = max(last[m.Key], seq)
					mu.Unlock()
					_ = d.Ack(ctx)
					mu.Lock()
					handled++
					if handled == n {
						cancel()
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		require.Equal(t, n, handled, "every event handled")
		return violations
	}
	require.Zero(t, run(t, true), "Ordered: each key in publish order")
	v := run(t, false)
	t.Logf("without Ordered: %d per-key order violations among 1,000 events over 50 keys, 4 receivers", v)
}

// A second worker joins the group mid-stream, then leaves: the rebalances
// move partitions (and redeliver what was in flight), yet every message
// has exactly one side effect (the worker's idempotent consumer absorbs
// the redeliveries).
func TestWorkerJoinsAndLeaves(t *testing.T) {
	tp := topology("kafka-join", time.Second)
	q := tp.Queues[0].Name
	pub := declared(t, tp)
	pool, _ := testenv.NewPool(t)
	workertest.CreateSchema(t, pool)
	handler := func(ctx context.Context, tx pgx.Tx, msg *broker.Message) error {
		time.Sleep(2 * time.Millisecond)
		_, err := tx.Exec(ctx, `INSERT INTO side_effects (consumer, message_id, attempt) VALUES ('join', $1, $2)`, msg.ID, msg.Attempt)
		return err
	}
	startWorker := func(b broker.Broker) (stop func()) {
		w, err := worker.New(worker.Config{Consumer: "join", Queue: q, Pool: pool, Broker: b, Handler: handler, Topology: tp, Concurrency: 4})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		var once sync.Once
		stop = func() {
			once.Do(func() {
				cancel()
				select {
				case err := <-done:
					require.NoError(t, err)
				case <-time.After(60 * time.Second):
					t.Error("worker did not stop")
				}
			})
		}
		t.Cleanup(stop)
		return stop
	}
	const n = 1500
	stopPub := make(chan struct{})
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		for i := 0; i < n; i += 50 {
			var batch []*broker.Message
			for j := i; j < i+50; j++ {
				batch = append(batch, &broker.Message{ID: strconv.Itoa(j), Type: "evt.j", Key: fmt.Sprint("k", j%30), Body: []byte("{}")})
			}
			if err := pub.Publish(context.Background(), batch); err != nil {
				t.Errorf("publish: %v", err)
				return
			}
			select {
			case <-stopPub:
				return
			case <-time.After(40 * time.Millisecond):
			}
		}
	}()
	defer func() { close(stopPub); <-pubDone }()
	stop1 := startWorker(newBroker(t))
	waitCount(t, pool, 200)
	b2 := newBroker(t)
	stop2 := startWorker(b2)
	waitCount(t, pool, 700)
	stop2()
	<-pubDone
	require.Eventually(t, func() bool { return countSide(t, pool) >= n }, 90*time.Second, 200*time.Millisecond)
	time.Sleep(2 * time.Second) // a duplicate side effect would show up now
	stop1()
	var dups, total int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FILTER (WHERE c > 1), count(*) FROM (SELECT message_id, count(*) c FROM side_effects WHERE consumer = 'join' GROUP BY message_id) s`).Scan(&dups, &total))
	require.Equal(t, n, total, "every message has a side effect")
	require.Zero(t, dups, "no message has two side effects")
}

func countSide(t *testing.T, pool *pgxpool.Pool) int {
	var c int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(DISTINCT message_id) FROM side_effects WHERE consumer = 'join'`).Scan(&c))
	return c
}

func waitCount(t *testing.T, pool *pgxpool.Pool, want int) {
	require.Eventually(t, func() bool { return countSide(t, pool) >= want }, 60*time.Second, 50*time.Millisecond)
}

// An existing topic with another partition count is
// broker.ErrTopologyMismatch, naming the topic and the setting; nothing is
// changed.
func TestTopologyMismatch(t *testing.T) {
	t.Parallel()
	tp := topology("kafka-mismatch")
	declared(t, tp)
	ctx := ctxFor(t, 30*time.Second)
	other, err := kafka.New(ctx, kafka.Config{Brokers: testenv.KafkaBrokers(), Partitions: 4})
	require.NoError(t, err)
	defer other.Close()
	err = other.Declare(ctx, tp)
	require.ErrorIs(t, err, broker.ErrTopologyMismatch)
	require.ErrorContains(t, err, tp.Exchange)
	require.ErrorContains(t, err, "3 partitions")
	_, err = kafka.New(ctx, kafka.Config{Brokers: testenv.KafkaBrokers(), Partitions: -1})
	require.ErrorContains(t, err, "Config.Partitions")
}

// The work topic is deleted under a running publisher and subscription
// that already consumed from it: the next publish declares it again, and
// the subscription reads the new log from its start (its old position is
// past the new log's end), so nothing published afterwards is skipped.
func TestTopicDeletedUnderSubscription(t *testing.T) {
	t.Parallel()
	tp := topology("kafka-deleted")
	b := declared(t, tp)
	sub := subscribe(t, b, tp.Queues[0].Name, broker.SubscribeOptions{Prefetch: 50})
	var first []*broker.Message
	for i := range 30 {
		first = append(first, &broker.Message{ID: fmt.Sprint("a", i), Type: "evt.d", Key: fmt.Sprint("k", i%3)})
	}
	require.NoError(t, b.Publish(ctxFor(t, 10*time.Second), first))
	for range 30 {
		require.NoError(t, receive(t, sub, 20*time.Second).Ack(ctxFor(t, 5*time.Second)))
	}
	time.Sleep(1500 * time.Millisecond) // committed
	c := &kafkago.Client{Addr: kafkago.TCP(testenv.KafkaBrokers()...), Timeout: 10 * time.Second}
	_, err := c.DeleteTopics(ctxFor(t, 10*time.Second), &kafkago.DeleteTopicsRequest{Topics: []string{kafka.TopicName(tp.Exchange)}})
	require.NoError(t, err)
	time.Sleep(2 * time.Second)
	var second []*broker.Message
	for i := range 6 {
		second = append(second, &broker.Message{ID: fmt.Sprint("b", i), Type: "evt.d", Key: fmt.Sprint("k", i%3)})
	}
	require.NoError(t, b.Publish(ctxFor(t, 30*time.Second), second), "the publish declares the topic again")
	var got []string
	for range 6 {
		d := receive(t, sub, 60*time.Second)
		got = append(got, d.Message().ID)
		require.NoError(t, d.Ack(ctxFor(t, 5*time.Second)))
	}
	require.ElementsMatch(t, []string{"b0", "b1", "b2", "b3", "b4", "b5"}, got)
}

// A Retry or DeadLetter whose write fails (here: its ctx has ended) gives
// the delivery up: the message is handed out again at once, as a broker
// redelivers after a failed settlement, and the prefetch slot is free
// (with Prefetch 1 the subscription would otherwise stall).
func TestFailedSettleRedelivers(t *testing.T) {
	t.Parallel()
	tp := topology("kafka-failsettle", 200*time.Millisecond)
	b := declared(t, tp)
	sub := subscribe(t, b, tp.Queues[0].Name, broker.SubscribeOptions{Prefetch: 1})
	require.NoError(t, b.Publish(ctxFor(t, 10*time.Second), []*broker.Message{{ID: "f1", Type: "evt.f", Key: "k"}, {ID: "f2", Type: "evt.f", Key: "k"}}))
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	d := receive(t, sub, 20*time.Second)
	require.Equal(t, "f1", d.Message().ID)
	require.Error(t, d.Retry(ended, 0, "boom"))
	d = receive(t, sub, 5*time.Second)
	require.Equal(t, "f1", d.Message().ID, "handed out again")
	require.Equal(t, 1, d.Message().Attempt, "a redelivery is not a retry")
	require.Error(t, d.DeadLetter(ended, "bad"))
	d = receive(t, sub, 5*time.Second)
	require.Equal(t, "f1", d.Message().ID)
	require.NoError(t, d.Ack(ctxFor(t, 5*time.Second)))
	d = receive(t, sub, 5*time.Second)
	require.Equal(t, "f2", d.Message().ID)
	require.NoError(t, d.Ack(ctxFor(t, 5*time.Second)))
	receiveNone(t, sub, time.Second)
}
