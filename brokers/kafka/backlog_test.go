package kafka_test

import (
	"fmt"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/kafka"
	"github.com/ferrymq/ferry/internal/testenv"
)

// TestBacklogAgainstRetention: Kafka deletes records by the topic's
// retention.ms whether a group read them or not, and no DLQ sees them,
// so ferry reports each queue's lag, the age of its oldest unread record
// and the topic's retention (the gauges the rule FerryQueueNearRetention
// compares) before that happens. With a retention of 4 s, records left
// unread for 2.5 s are past half of it; once consumed, the lag is 0.
func TestBacklogAgainstRetention(t *testing.T) {
	tp := topology("backlog", time.Minute)
	b := declared(t, tp)
	ctx := ctxFor(t, 60*time.Second)
	queue := tp.Queues[0].Name
	br, ok := b.(broker.BacklogReporter)
	require.True(t, ok, "the Kafka adapter reports its backlog")

	c := &kafkago.Client{Addr: kafkago.TCP(testenv.KafkaBrokers()...), Timeout: 10 * time.Second}
	res, err := c.IncrementalAlterConfigs(ctx, &kafkago.IncrementalAlterConfigsRequest{Resources: []kafkago.IncrementalAlterConfigsRequestResource{{
		ResourceType: kafkago.ResourceTypeTopic, ResourceName: kafka.TopicName(tp.Exchange),
		Configs: []kafkago.IncrementalAlterConfigsRequestConfig{{Name: "retention.ms", Value: "4000", ConfigOperation: kafkago.ConfigOperationSet}}}}})
	require.NoError(t, err)
	for _, r := range res.Resources {
		require.NoError(t, r.Error)
	}

	bl, err := br.Backlog(ctx, queue)
	require.NoError(t, err)
	require.Zero(t, bl.Messages)
	require.Zero(t, bl.OldestAge)
	require.Equal(t, 4*time.Second, bl.Retention, "with nothing waiting, the work topic's")

	var msgs []*broker.Message
	for i := range 5 {
		msgs = append(msgs, &broker.Message{ID: fmt.Sprint(i), Type: "evt.x", Key: fmt.Sprint(i), Body: []byte("{}")})
	}
	require.NoError(t, b.Publish(ctx, msgs))
	time.Sleep(2500 * time.Millisecond)
	bl, err = br.Backlog(ctx, queue)
	require.NoError(t, err)
	t.Logf("backlog: %d records, oldest %v, retention %v", bl.Messages, bl.OldestAge, bl.Retention)
	require.Equal(t, int64(5), bl.Messages, "the group's lag")
	require.Equal(t, 4*time.Second, bl.Retention, "the topic's retention.ms")
	require.Greater(t, bl.OldestAge.Seconds()/bl.Retention.Seconds(), 0.5, "past half the retention: FerryQueueNearRetention's condition")

	sub, err := b.Subscribe(ctx, queue, broker.SubscribeOptions{Prefetch: 10})
	require.NoError(t, err)
	defer sub.Close()
	for i := range 5 {
		d, err := sub.Receive(ctx)
		require.NoError(t, err)
		if i == 0 {
			// A retry waiting its delay is still unread work of the
			// queue: its retry topic's lag counts.
			require.NoError(t, d.Retry(ctx, time.Minute, "later"))
			continue
		}
		require.NoError(t, d.Ack(ctx))
	}
	require.Eventually(t, func() bool {
		bl, err = br.Backlog(ctx, queue)
		require.NoError(t, err)
		return bl.Messages == 1
	}, 20*time.Second, 200*time.Millisecond, "the lag falls to the one retry waiting once the records are consumed: %+v", bl)
	t.Logf("backlog with one retry waiting: %+v", bl)
	require.Less(t, bl.OldestAge, 10*time.Second)

	_, err = br.Backlog(ctx, "no-such-queue")
	require.ErrorIs(t, err, broker.ErrUnknownQueue)
}

// TestSessionTimeoutOutsideBrokerRange: a Config.SessionTimeout the
// broker does not accept (below group.min.session.timeout.ms, 6 s by
// default) would make every join of the group fail; Subscribe refuses it
// at once, naming both settings and a value that works.
func TestSessionTimeoutOutsideBrokerRange(t *testing.T) {
	tp := topology("session")
	declared(t, tp) // creates the topics, deleted when the test ends
	ctx := ctxFor(t, 30*time.Second)
	b, err := kafka.New(ctx, kafka.Config{Brokers: testenv.KafkaBrokers(), SessionTimeout: 2 * time.Second})
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.Declare(ctx, tp))
	_, err = b.Subscribe(ctx, tp.Queues[0].Name, broker.SubscribeOptions{})
	require.ErrorIs(t, err, broker.ErrUnsupported)
	t.Log(err)
	for _, w := range []string{"Config.SessionTimeout 2s", "group.min.session.timeout.ms 6s", "group.max.session.timeout.ms", "e.g. 10s"} {
		require.Contains(t, err.Error(), w)
	}
}
