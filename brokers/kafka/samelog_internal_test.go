package kafka

import (
	"context"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
)

// The check behind a recreated topic's detection (sameLog, idleLogGone):
// a record read is found again at its offset while its log lives, and
// not once the topic was deleted and created again, both when the new
// log is shorter and when it already reaches the record's offset. A
// false "gone" would make a subscription read its whole log again.
func TestSameLogSeesARecreatedTopic(t *testing.T) {
	testenv.RequireTCP(t, "kafka", testenv.KafkaBrokers()[0])
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bb, err := New(ctx, Config{Brokers: testenv.KafkaBrokers(), Partitions: 1})
	require.NoError(t, err)
	defer bb.Close()
	kb := bb.(*kafkaBroker)
	base := testenv.UniqueName("samelog")
	tp := broker.Topology{Exchange: base + ".ex", Queues: []broker.Queue{{Name: base + ".work", Bindings: []string{"evt.#"}}}}
	require.NoError(t, kb.Declare(ctx, tp))
	admin := &kafkago.Client{Addr: kafkago.TCP(testenv.KafkaBrokers()...), Timeout: 10 * time.Second}
	defer func() {
		_, _ = admin.DeleteTopics(context.Background(), &kafkago.DeleteTopicsRequest{Topics: TopicNames(tp)})
	}()
	publish := func(prefix string, n int) {
		var msgs []*broker.Message
		for i := range n {
			msgs = append(msgs, &broker.Message{ID: prefix + string(rune('a'+i)), Type: "evt.x", Key: "k", Body: []byte(prefix)})
		}
		require.NoError(t, kb.Publish(ctx, msgs))
	}
	publish("old", 6)
	r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: testenv.KafkaBrokers(), Topic: TopicName(tp.Exchange), Partition: 0, Dialer: kb.dialer})
	defer r.Close()
	require.NoError(t, r.SetOffset(3))
	last, err := r.FetchMessage(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, last.Offset)

	sub := &subscription{b: kb}
	same, err := sub.sameLog(ctx, &last)
	require.NoError(t, err)
	require.True(t, same, "the record read is at its offset in the same log")
	gone, err := sub.idleLogGone(ctx, &last)
	require.NoError(t, err)
	require.False(t, gone, "the log still reaches the record read")

	_, err = admin.DeleteTopics(ctx, &kafkago.DeleteTopicsRequest{Topics: TopicNames(tp)})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return kb.Declare(ctx, tp) == nil }, 30*time.Second, 200*time.Millisecond)
	publish("new", 2) // offsets 0 and 1: shorter than the old log
	require.Eventually(t, func() bool {
		gone, err := sub.idleLogGone(ctx, &last)
		return err == nil && gone
	}, 10*time.Second, 100*time.Millisecond, "a new log ending before the record read is seen")
	same, err = sub.sameLog(ctx, &last)
	require.NoError(t, err)
	require.False(t, same)

	publish("new", 6) // offsets 2..7: the new log reaches offset 3 again
	gone, err = sub.idleLogGone(ctx, &last)
	require.NoError(t, err)
	require.False(t, gone)
	same, err = sub.sameLog(ctx, &last)
	require.NoError(t, err)
	require.False(t, same, "another record at the offset read means a new log")
}
