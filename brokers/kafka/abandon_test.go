package kafka_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/brokers/kafka"
	"github.com/ferrymq/ferry/internal/procstat"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// kafkaPID returns the pid of the Kafka JVM that compose/local/services.sh
// started (its state folder is FERRY_STATE_DIR, else compose/local/.state).
func kafkaPID(t *testing.T) int {
	t.Helper()
	dir := os.Getenv("FERRY_STATE_DIR")
	if dir == "" {
		dir = filepath.Join(testenv.RepoRoot(), "compose", "local", ".state")
	}
	raw, err := os.ReadFile(filepath.Join(dir, "kafka.pid"))
	require.NoError(t, err, "the Kafka pid file of compose/local/services.sh")
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	require.NoError(t, err)
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	require.NoError(t, err, "Kafka (pid %d) is running", pid)
	require.Contains(t, string(cmdline), "kafka", "pid %d is the Kafka JVM", pid)
	return pid
}

// pauseKafka stops the Kafka JVM with SIGSTOP: connections stay open and
// the kernel still accepts and buffers what is written to them, but
// nothing answers (a blackhole, as a network partition or a long GC
// pause looks to a client). It returns the function that resumes it
// (SIGCONT), which also runs when the test ends, so the shared server is
// never left stopped.
func pauseKafka(t *testing.T) (resume func()) {
	t.Helper()
	pid := kafkaPID(t)
	var once sync.Once
	resume = func() {
		once.Do(func() {
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Errorf("resume Kafka (pid %d): %v", pid, err)
			}
		})
	}
	t.Cleanup(resume)
	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
	return resume
}

// copiesPerID reads every record of topic (all partitions, from the first
// offset to the end) and counts the records of each x-ferry-id.
func copiesPerID(t *testing.T, topic string, partitions int) map[string]int {
	t.Helper()
	ctx := ctxFor(t, 60*time.Second)
	c := &kafkago.Client{Addr: kafkago.TCP(testenv.KafkaBrokers()...), Timeout: 10 * time.Second}
	req := map[string][]kafkago.OffsetRequest{}
	for p := range partitions {
		req[topic] = append(req[topic], kafkago.LastOffsetOf(p))
	}
	res, err := c.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: req})
	require.NoError(t, err)
	out := map[string]int{}
	for _, po := range res.Topics[topic] {
		require.NoError(t, po.Error)
		if po.LastOffset == 0 {
			continue
		}
		r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: testenv.KafkaBrokers(), Topic: topic, Partition: po.Partition, MaxBytes: 8 << 20})
		for {
			m, err := r.ReadMessage(ctx)
			require.NoError(t, err)
			for _, h := range m.Headers {
				if h.Key == "x-ferry-id" {
					out[string(h.Value)]++
				}
			}
			if m.Offset+1 >= po.LastOffset {
				break
			}
		}
		require.NoError(t, r.Close())
	}
	return out
}

// A publish ferry gave up on is neither delivered later nor held in
// memory (issue 16, item 3; kafka-go issue 1427). Kafka is paused
// (SIGSTOP) for 30 s under a running relay with rows of 32 KiB, as a
// blackhole; the relay's Publish and the adapter's PublishTimeout are 2 s,
// so the outage is 15 publish timeouts long (as the 5-minute
// blackhole is 10 of the default 30 s). Every failed publish is an outage
// probe. kafka-go's Writer kept each probe's batch queued and retried it
// in the background after WriteMessages had returned, so memory grew by a
// batch per probe and, once Kafka was back, every queued batch and every
// retry of it was written next to the relay's own publish. Now a probe
// abandoned leaves nothing in the client: the Go heap stays flat during
// the outage and each id is in the topic at most once per failed probe
// plus once (a produce request already written to the paused broker's
// socket is stored when it resumes; no client can take that back).
// Not parallel: it pauses the shared Kafka (kept short).
func TestAbandonedPublishNotDeliveredLater(t *testing.T) {
	const (
		rows           = 50
		rowBytes       = 32 << 10
		publishTimeout = 2 * time.Second
		pause          = 30 * time.Second
	)
	tp := topology("kafka-abandon")
	testenv.RequireTCP(t, "kafka", testenv.KafkaBrokers()[0])
	b, err := kafka.New(ctxFor(t, 30*time.Second), kafka.Config{Brokers: testenv.KafkaBrokers(), PublishTimeout: publishTimeout})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	require.NoError(t, b.Declare(ctxFor(t, 30*time.Second), tp))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		deleteTopology(ctx, t, tp)
	})
	pool, _ := testenv.NewPool(t)
	require.NoError(t, outbox.Migrate(context.Background(), pool))

	var failedProbes, published atomic.Int64
	r, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Broker: b, Concurrency: 1, PublishTimeout: publishTimeout,
		MaxBackoff: time.Second, Retention: -1,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
		OnBatch: func(s outbox.BatchStats) {
			if s.Err != nil {
				failedProbes.Add(1)
			}
			published.Add(int64(s.Published))
		}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("relay did not stop within 30s of its cancel")
		}
	})
	// One warm-up row so the relay's connections and metadata are up.
	enqueueBodies(t, pool, 1, 16)
	require.Eventually(t, func() bool { return published.Load() == 1 }, 30*time.Second, 20*time.Millisecond, "the warm-up row is published")

	resume := pauseKafka(t)
	pausedAt := time.Now()
	enqueueBodies(t, pool, rows, rowBytes)
	require.Eventually(t, func() bool { return failedProbes.Load() >= 1 }, 2*publishTimeout+5*time.Second, 20*time.Millisecond,
		"the first publish to the paused broker fails")
	heap0, rss0 := procstat.SelfMemory()
	var heapMax, rssMax uint64
	for time.Since(pausedAt) < pause {
		time.Sleep(500 * time.Millisecond)
		h, r := procstat.SelfMemory()
		heapMax, rssMax = max(heapMax, h), max(rssMax, r)
	}
	probes := failedProbes.Load()
	resume()
	recovered := time.Now()
	require.Eventually(t, func() bool { return unprocessed(t, pool) == 0 }, 30*time.Second, 50*time.Millisecond, "rows go out once Kafka is back")
	took := time.Since(recovered)
	// Let whatever a client still held arrive (the old Writer flushed its
	// queued batches within a few seconds of the broker's return).
	time.Sleep(5 * time.Second)
	probes = failedProbes.Load() // the last ones may have ended after resume

	copies := copiesPerID(t, kafka.TopicName(tp.Exchange), kafka.DefaultPartitions)
	minC, maxC, total := 1<<30, 0, 0
	for _, n := range copies {
		minC, maxC, total = min(minC, n), max(maxC, n), total+n
	}
	batch := uint64(rows * rowBytes)
	heapGrowth := int64(heapMax) - int64(heap0)
	t.Logf("paused %v: %d failed probes, heap in use %.1f MB at the first failed probe, growth %+.1f MB (%.2f batches of %.1f MB); RSS %.1f MB, growth %+.1f MB",
		pause, probes, mb(heap0), float64(heapGrowth)/(1<<20), float64(heapGrowth)/float64(batch), mb(batch), mb(rss0), (float64(rssMax)-float64(rss0))/(1<<20))
	t.Logf("after recovery: every row published %v after resume; %d ids, copies per id min %d, max %d, mean %.1f (bound: failed probes + 1 = %d)",
		took.Round(10*time.Millisecond), len(copies), minC, maxC, float64(total)/float64(max(len(copies), 1)), probes+1)

	require.Len(t, copies, rows+1, "every row is in the topic")
	require.GreaterOrEqual(t, minC, 1)
	require.LessOrEqual(t, int64(maxC), probes+1, "each id is in the topic at most once per failed probe plus once")
	// Flat: what one abandoned probe may still hold (its request in the
	// transport until the deadline) and noise, never a batch per probe.
	require.Less(t, heapGrowth, int64(3*batch), "the Go heap does not grow with each probe during the outage")
}

// enqueueBodies enqueues n rows with bodies of size bytes each.
func enqueueBodies(t *testing.T, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, n, size int) {
	t.Helper()
	ctx := ctxFor(t, 10*time.Second)
	body := bytes.Repeat([]byte("x"), size)
	evs := make([]outbox.Event, n)
	for i := range evs {
		evs[i] = outbox.Event{Type: "evt.abandon", Key: fmt.Sprint("k", i), Body: body}
	}
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = outbox.Enqueue(ctx, tx, evs...)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
}

func mb(n uint64) float64 { return float64(n) / (1 << 20) }
