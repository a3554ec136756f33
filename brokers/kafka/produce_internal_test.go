package kafka

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/produce"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
)

// A produce request is sent again only when it is known not to be stored
// (see retriable): sending again one that may be stored would make a copy
// per retry.
func TestRetriableOnlyWhenNotStored(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{kafkago.NotLeaderForPartition, true},
		{kafkago.LeaderNotAvailable, true},
		{kafkago.NotEnoughReplicas, true},
		{fmt.Errorf("kafka.(*Client).Produce: %w", kafkago.NotLeaderForPartition), true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		// The leader appended the records before these.
		{kafkago.NotEnoughReplicasAfterAppend, false},
		{kafkago.RequestTimedOut, false},
		// write declares a missing topic again.
		{kafkago.UnknownTopicOrPartition, false},
		// The request may have been written before the connection broke.
		{&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, false},
		{&net.OpError{Op: "write", Net: "tcp", Err: syscall.EPIPE}, false},
		{io.ErrUnexpectedEOF, false},
		{context.DeadlineExceeded, false},
		{kafkago.MessageSizeTooLarge, false},
	} {
		require.Equal(t, c.want, retriable(c.err), "%v", c.err)
	}
}

// failFirstProduce answers the first produce request with a retriable
// error (NOT_LEADER_OR_FOLLOWER, as a broker just restarted or moving a
// partition's leadership does) after reading its records, as encoding the
// request on a connection reads them; every other request goes to the
// real broker.
type failFirstProduce struct {
	next  kafkago.RoundTripper
	calls atomic.Int32
}

func (f *failFirstProduce) RoundTrip(ctx context.Context, addr net.Addr, req protocol.Message) (protocol.Message, error) {
	p, ok := req.(*produce.Request)
	if !ok || f.calls.Add(1) > 1 {
		return f.next.RoundTrip(ctx, addr, req)
	}
	res := &produce.Response{}
	for _, t := range p.Topics {
		rt := produce.ResponseTopic{Topic: t.Topic}
		for _, pp := range t.Partitions {
			for {
				r, err := pp.RecordSet.Records.ReadRecord()
				if err != nil {
					break
				}
				for _, b := range []protocol.Bytes{r.Key, r.Value} {
					if b != nil {
						_, _ = io.Copy(io.Discard, b)
					}
				}
			}
			rt.Partitions = append(rt.Partitions, produce.ResponsePartition{
				Partition: pp.Partition, ErrorCode: int16(kafkago.NotLeaderForPartition), BaseOffset: -1,
			})
		}
		res.Topics = append(res.Topics, rt)
	}
	return res, nil
}

// A produce request sent again after a retriable refusal carries the same
// keys and bodies as the first: once, every record of such a retry reached
// the topic with an empty key and body (the first request had read them),
// and the worker dead-lettered them all ("unexpected end of JSON input").
func TestRetriedProduceKeepsBodies(t *testing.T) {
	testenv.RequireTCP(t, "kafka", testenv.KafkaBrokers()[0])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bb, err := New(ctx, Config{Brokers: testenv.KafkaBrokers()})
	require.NoError(t, err)
	defer bb.Close()
	kb := bb.(*kafkaBroker)
	ff := &failFirstProduce{next: kb.transport}
	kb.client.Transport = ff

	base := testenv.UniqueName("retried")
	tp := broker.Topology{Exchange: base + ".ex", Queues: []broker.Queue{{Name: base + ".work", Bindings: []string{"evt.#"}}}}
	require.NoError(t, kb.Declare(ctx, tp))
	defer func() {
		c := &kafkago.Client{Addr: kafkago.TCP(testenv.KafkaBrokers()...), Timeout: 10 * time.Second}
		_, _ = c.DeleteTopics(context.Background(), &kafkago.DeleteTopicsRequest{Topics: TopicNames(tp)})
	}()
	sub, err := kb.Subscribe(ctx, base+".work", broker.SubscribeOptions{Prefetch: 10})
	require.NoError(t, err)
	defer sub.Close()

	const key = "user-7" // one key: one partition, one chunk, one retried request
	want := map[string]string{}
	var msgs []*broker.Message
	for i := range 5 {
		id := fmt.Sprintf("m%d", i)
		body := fmt.Sprintf(`{"n":%d}`, i)
		want[id] = body
		msgs = append(msgs, &broker.Message{ID: id, Type: "evt.created", Key: key, Body: []byte(body)})
	}
	require.NoError(t, kb.Publish(ctx, msgs))
	require.GreaterOrEqual(t, ff.calls.Load(), int32(2), "the first produce request was refused and sent again")

	got := map[string]string{}
	for len(got) < len(want) {
		d, err := sub.Receive(ctx)
		require.NoError(t, err, "received %d of %d", len(got), len(want))
		m := d.Message()
		require.Equal(t, key, m.Key, "message %s", m.ID)
		got[m.ID] = string(m.Body)
		require.NoError(t, d.Ack(ctx))
	}
	require.Equal(t, want, got)
}

// A partition leader without room for the write (too few in-sync
// replicas for acks=all, its log directory offline) is broker.ErrBlocked
// with Kafka's description, also when the deadline passed while the
// adapter was sending the request again; it is never a message fault.
// The real refusal cannot be had from the single-node test Kafka: since
// Kafka 3.7 the effective min ISR is min(min.insync.replicas, replica
// count) (apache/kafka#14594), so a one-replica topic never refuses.
func TestNoRoomIsBlocked(t *testing.T) {
	for _, ke := range []kafkago.Error{kafkago.NotEnoughReplicas, kafkago.NotEnoughReplicasAfterAppend, kafkago.KafkaStorageError} {
		err := noRoom(ke, ke)
		reason, ok := broker.BlockedReason(err)
		require.True(t, ok, "%v", ke)
		require.Equal(t, ke.Error(), reason)
		require.ErrorIs(t, err, ke)
		require.False(t, broker.IsMessageFault(err))

		late := noRoom(fmt.Errorf("%w (%v)", context.DeadlineExceeded, ke), ke)
		require.ErrorIs(t, late, broker.ErrBlocked)
		require.ErrorIs(t, late, context.DeadlineExceeded)
		_, ok = broker.BlockedReason(&broker.PublishError{Failed: []broker.FailedMessage{{Index: 0, ID: "1", Err: late}}})
		require.True(t, ok, "found in a PublishError")
	}
	for _, other := range []error{kafkago.NotLeaderForPartition, kafkago.RequestTimedOut, context.DeadlineExceeded} {
		_, ok := broker.BlockedReason(noRoom(other, other))
		require.False(t, ok, "%v", other)
	}
}
