package console_test

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/console"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// BenchmarkPagesOnBigBacklog fills an outbox with 1,000,000 unprocessed
// rows (100,000 of them parked, all with an app id) on a destination no
// relay serves, and a DLQ with 10,000 dead messages (on NATS;
// FERRY_CONSOLE_BENCH_BROKER and FERRY_CONSOLE_BENCH_DEAD change the
// broker and the count), then times each
// page of the console (ms/op, and the median and slowest of the runs in
// the log). It asserts nothing; the aim is 200 ms a page.
//
//	go test -run '^$' -bench PagesOnBigBacklog -benchtime 5x -timeout 30m ./console/
func BenchmarkPagesOnBigBacklog(b *testing.B) {
	setupTimeout = 30 * time.Minute
	defer func() { setupTimeout = 4 * time.Minute }()
	brokerName := testenv.Env("FERRY_CONSOLE_BENCH_BROKER", "nats")
	dead, err := strconv.Atoi(testenv.Env("FERRY_CONSOLE_BENCH_DEAD", "10000"))
	require.NoError(b, err, "FERRY_CONSOLE_BENCH_DEAD")
	bu := setup(b, brokerName, console.Config{Token: testToken, DLQCacheTTL: time.Hour})
	// The fill commits asynchronously (synchronous_commit off for this
	// database): on a shared machine an fsync per dead-lettered message
	// takes seconds, and the pages only read.
	_, err = bu.pool.Exec(bu.ctx, `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET synchronous_commit = off', current_database()); END $$`)
	require.NoError(b, err)
	bu.pool.Reset()
	start := time.Now()
	_, err = bu.pool.Exec(bu.ctx, `INSERT INTO outbox (event_type, partition_key, payload, headers, destination, occurred_at, attempts, last_error, next_attempt_at)
SELECT 'job.big', 'k' || (g % 1000), '{"n":1}', jsonb_build_object('x-app-id', 'big-' || g), 'big', now() - interval '1 hour' + g * interval '1 millisecond',
       CASE WHEN g % 10 = 0 THEN 1 ELSE 0 END, CASE WHEN g % 10 = 0 THEN 'unroutable: no queue bound to job.big' END,
       CASE WHEN g % 10 = 0 THEN now() + interval '1 hour' END
FROM generate_series(1, 1000000) g`)
	require.NoError(b, err)
	_, err = bu.pool.Exec(bu.ctx, `VACUUM ANALYZE outbox`)
	require.NoError(b, err)
	b.Logf("filled 1,000,000 outbox rows (100,000 parked) in %v", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	var evs []outbox.Event
	for i := range dead {
		evs = append(evs, outbox.Event{Type: "job.run", AppID: "dead-" + strconv.Itoa(i), Body: []byte(`{"n":2}`)})
		if len(evs) == 1000 || i == dead-1 {
			bu.enqueue(b, evs...)
			evs = nil
		}
	}
	for {
		var n int
		require.NoError(b, bu.pool.QueryRow(bu.ctx, `SELECT count(*) FROM worker_dead`).Scan(&n))
		if n >= dead {
			break
		}
		select {
		case <-bu.ctx.Done():
			b.Fatalf("only %d of %d dead-lettered", n, dead)
		case <-time.After(time.Second):
		}
	}
	b.Logf("%d messages dead-lettered on %s in %v", dead, brokerName, time.Since(start).Round(time.Millisecond))
	start = time.Now()
	msgs := bu.waitDead(b, dead)
	b.Logf("one List of the %d dead messages from %s: %v", dead, brokerName, time.Since(start).Round(time.Millisecond))
	q := url.QueryEscape(bu.queue)
	pages := []struct{ name, path string }{
		{"overview", "/"},
		{"outbox-parked", "/outbox?state=parked"},
		{"outbox-pending", "/outbox?state=pending"},
		{"outbox-pending-page-1000", "/outbox?state=pending&after=500000"},
		{"outbox-by-app-id", "/outbox?state=pending&app_id=big-777777"},
		{"outbox-parked-error", "/outbox?state=parked&error=unroutable"},
		{"outbox-row", "/outbox/row?id=123456"},
		{"story-by-app-id", "/story?q=big-424242"},
		{"story-by-id", "/story?q=424242"},
		{"dlq-fresh-read", "/dlq?queue=" + q + "&fresh=1"},
		{"dlq-cached", "/dlq?queue=" + q},
		{"dlq-by-app-id", "/dlq?queue=" + q + "&app_id=dead-5000"},
		{"dlq-message", "/dlq/message?queue=" + q + "&id=" + msgs[len(msgs)/2].Message.ID},
		{"api-overview", "/api/overview"},
	}
	client := &http.Client{}
	var report string
	for _, p := range pages {
		var runs []time.Duration
		var size int64
		b.Run(p.name, func(b *testing.B) {
			for b.Loop() {
				t0 := time.Now()
				resp, err := client.Get(bu.base + p.path)
				require.NoError(b, err)
				size, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				require.Equal(b, http.StatusOK, resp.StatusCode, p.path)
				runs = append(runs, time.Since(t0))
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/page")
			b.ReportMetric(float64(size), "bytes/page")
		})
		sort.Slice(runs, func(i, j int) bool { return runs[i] < runs[j] })
		if len(runs) > 0 {
			report += fmt.Sprintf("  %-26s median %7.1f ms  slowest %7.1f ms  (%d runs)  %8d bytes\n", p.name,
				float64(runs[len(runs)/2].Microseconds())/1000, float64(runs[len(runs)-1].Microseconds())/1000, len(runs), size)
		}
	}
	b.Logf("page timings on %s, 1,000,000 outbox rows, 100,000 parked, %d dead:\n%s", brokerName, dead, report)
}
