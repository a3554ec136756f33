package nats_test

import (
	"context"

	"strconv"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/nats"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/worker/workertest"
)

const benchBatch = 100

var benchBody = []byte(`{"to":"user@example.com","subject":"Welcome","template":"welcome","user_id":42}`)

// benchTopology declares a one-queue topology (so interest retention
// stores the messages) and returns the broker and the event type.
func benchTopology(b *testing.B) (broker.Broker, broker.Topology, string) {
	bk := newBroker(b)
	tp := topology("nats-bench", "bench.created")
	require.NoError(b, bk.Declare(context.Background(), tp))
	return bk, tp, "bench.created"
}

// BenchmarkRawPublish is the baseline: nats.go jetstream async publishes
// of batches of 100 to the same stream and subject the adapter uses, with
// Nats-Msg-Id, every PubAck awaited.
func BenchmarkRawPublish(b *testing.B) {
	_, tp, typ := benchTopology(b)
	nc, err := natsgo.Connect(testenv.NATSURL())
	require.NoError(b, err)
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(8192))
	require.NoError(b, err)
	subject := nats.StreamName(tp.Exchange) + "." + typ
	b.ResetTimer()
	start := time.Now()
	for sent := 0; sent < b.N; {
		n := min(benchBatch, b.N-sent)
		futures := make([]jetstream.PubAckFuture, n)
		for i := range futures {
			m := natsgo.NewMsg(subject)
			m.Data = benchBody
			m.Header.Set(jetstream.MsgIDHeader, "raw-"+strconv.Itoa(sent+i))
			f, err := js.PublishMsgAsync(m)
			if err != nil {
				b.Fatal(err)
			}
			futures[i] = f
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				b.Fatal(err)
			}
		}
		sent += n
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

// BenchmarkAdapterPublish is broker.Broker.Publish in batches of 100, the
// relay's shape: validation, routing check, headers, async publish, every
// PubAck awaited.
func BenchmarkAdapterPublish(b *testing.B) {
	bk, _, typ := benchTopology(b)
	ctx := context.Background()
	created := broker.FormatTime(time.Now())
	b.ResetTimer()
	start := time.Now()
	for sent := 0; sent < b.N; {
		n := min(benchBatch, b.N-sent)
		msgs := make([]*broker.Message, n)
		for i := range msgs {
			msgs[i] = &broker.Message{ID: strconv.Itoa(sent + i), Type: typ, Key: "user-42", Body: benchBody,
				Headers: map[string]string{broker.HeaderCreatedAt: created}}
		}
		if err := bk.Publish(ctx, msgs); err != nil {
			b.Fatal(err)
		}
		sent += n
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

// BenchmarkWorker runs the worker's benchmark (package workertest) on NATS.
func BenchmarkWorker(b *testing.B) {
	workertest.RunWorkerBenchmark(b, newBroker, 0)
}
