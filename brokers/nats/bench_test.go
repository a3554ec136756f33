package nats_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"syscall"
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

var benchBody = []byte(`{"to":"user@example.com","subject":"Welcome","template":"welcome","user_id":42}`)

const benchTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// benchShapes are the batch shapes both publish benchmarks run: the
// relay's default batch, and the bench package's relay settings (batch
// 500, 2 claim loops publishing concurrently through one connection).
var benchShapes = []struct{ batch, callers int }{{100, 1}, {500, 1}, {500, 2}}

// benchTopology declares a one-queue topology (so interest retention
// stores the messages) and returns the broker and the event type.
func benchTopology(b *testing.B) (broker.Broker, broker.Topology, string) {
	bk := newBroker(b)
	tp := topology("nats-bench", "bench.created")
	require.NoError(b, bk.Declare(context.Background(), tp))
	return bk, tp, "bench.created"
}

// runBatches splits b.N messages into batches of size batch over callers
// goroutines, calls publish(first, n) for each batch, and reports msgs/s.
func runBatches(b *testing.B, batch, callers int, publish func(first, n int) error) {
	var (
		mu   sync.Mutex
		next int
		wg   sync.WaitGroup
		errs = make(chan error, callers)
	)
	take := func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		first := next
		n := min(batch, b.N-first)
		next += n
		return first, n
	}
	b.ResetTimer()
	start, cpu0 := time.Now(), processCPU()
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				first, n := take()
				if n <= 0 {
					return
				}
				if err := publish(first, n); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/msg")
}

// processCPU is the user+system CPU time this process has used: on a
// shared machine the client's cost per message is steadier than its
// throughput, which also depends on the server's share of the CPU.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkRawPublish is the baseline: nats.go jetstream async publishes
// to the same stream and subject the adapter uses, with the same headers
// the adapter puts on the wire (Nats-Msg-Id, Ferry-Id, Ferry-Type,
// Ferry-Key, traceparent, x-created-at), every PubAck of a batch awaited
// before the caller's next batch.
func BenchmarkRawPublish(b *testing.B) {
	for _, s := range benchShapes {
		b.Run(fmt.Sprintf("batch=%d/callers=%d", s.batch, s.callers), func(b *testing.B) {
			_, tp, typ := benchTopology(b)
			nc, err := natsgo.Connect(testenv.NATSURL())
			require.NoError(b, err)
			defer nc.Close()
			js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(8192))
			require.NoError(b, err)
			subject := nats.StreamName(tp.Exchange) + "." + typ
			created := broker.FormatTime(time.Now())
			runBatches(b, s.batch, s.callers, func(first, n int) error {
				futures := make([]jetstream.PubAckFuture, n)
				for i := range futures {
					id := strconv.Itoa(first + i)
					m := &natsgo.Msg{Subject: subject, Data: benchBody, Header: natsgo.Header{
						jetstream.MsgIDHeader:    []string{id + "@" + created},
						"Ferry-Id":               []string{id},
						"Ferry-Type":             []string{typ},
						"Ferry-Key":              []string{"user-42"},
						broker.HeaderTraceparent: []string{benchTraceparent},
						broker.HeaderCreatedAt:   []string{created},
					}}
					f, err := js.PublishMsgAsync(m)
					if err != nil {
						return err
					}
					futures[i] = f
				}
				for _, f := range futures {
					select {
					case <-f.Ok():
					case err := <-f.Err():
						return err
					}
				}
				return nil
			})
		})
	}
}

// BenchmarkAdapterPublish is broker.Broker.Publish in the shapes of
// BenchmarkRawPublish, with the relay's messages (ID, Type, Key,
// traceparent and created-at headers): validation, routing check,
// headers, async publish, every PubAck awaited.
func BenchmarkAdapterPublish(b *testing.B) {
	for _, s := range benchShapes {
		b.Run(fmt.Sprintf("batch=%d/callers=%d", s.batch, s.callers), func(b *testing.B) {
			bk, _, typ := benchTopology(b)
			ctx := context.Background()
			created := broker.FormatTime(time.Now())
			runBatches(b, s.batch, s.callers, func(first, n int) error {
				msgs := make([]*broker.Message, n)
				for i := range msgs {
					msgs[i] = &broker.Message{ID: strconv.Itoa(first + i), Type: typ, Key: "user-42", Body: benchBody,
						Headers: map[string]string{broker.HeaderCreatedAt: created, broker.HeaderTraceparent: benchTraceparent}}
				}
				return bk.Publish(ctx, msgs)
			})
		})
	}
}

// BenchmarkWorker runs the worker's benchmark (package workertest) on NATS.
func BenchmarkWorker(b *testing.B) {
	workertest.RunWorkerBenchmark(b, newBroker, 0)
}
