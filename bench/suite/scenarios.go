package suite

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/runcost"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// runTimeout bounds one scenario run's wait for its messages.
const runTimeout = 10 * time.Minute

// openRaw connects t's raw client and records the server's version; a
// broker without one gives a "not supported" result.
func (r *runner) openRaw(ctx context.Context, t Target) (rawClient, *Result, error) {
	if t.URL == "" {
		return nil, &Result{Status: statusUnsupported, Note: "no server URL for the raw client"}, nil
	}
	rc, err := newRawClient(ctx, t.Name, t.URL)
	if errors.Is(err, errNoRaw) {
		return nil, &Result{Status: statusUnsupported, Note: "no raw client for " + t.Name + " in bench yet"}, nil
	}
	if err != nil {
		return nil, nil, err
	}
	where := t.Where
	if where == "" {
		where = t.URL
	}
	r.servers[t.Name] = rc.version() + " (" + where + ")"
	return rc, nil, nil
}

// raw: the broker alone, its own client, publish with confirms in the
// relay's shape, then consume with ack.
func (r *runner) raw(ctx context.Context, t Target) ([]Result, error) {
	rc, res, err := r.openRaw(ctx, t)
	if res != nil || err != nil {
		return nilIf(res), err
	}
	defer rc.close()
	n := r.cfg.Messages
	b := r.newBar("raw "+t.Name+" publish", n)
	pub, err := rc.publish(ctx, n, r.cfg.Size)
	if err != nil {
		return nil, err
	}
	b.finish(int64(n))
	b = r.newBar("raw "+t.Name+" consume", n)
	con, err := rc.consume(ctx, n)
	if err != nil {
		return nil, err
	}
	b.finish(int64(n))
	ack := "one consumer acking each"
	switch t.Name {
	case "kafka":
		// Kafka's ack is an offset commit, which covers every record below it.
		ack = fmt.Sprintf("one consumer group member committing its offset every %d records (Kafka's ack); one partition", relayBatch)
	case "sqs":
		ack = fmt.Sprintf("%d ReceiveMessage loops of %d, each call's messages deleted with one DeleteMessageBatch (SQS's ack); SendMessageBatch calls of %d, %d in flight",
			sqsPollers, sqsBatchEntries, sqsBatchEntries, sqsSendConcurrency)
	}
	out := Result{Messages: n, Seconds: (pub + con).Seconds(),
		Note: fmt.Sprintf("%d publishers at once, batches of %d with every confirm awaited; %s", relayConcurrency, relayBatch, ack)}
	if s, ok := rc.(interface{ startup() time.Duration }); ok {
		out.Note += fmt.Sprintf("; consume timed from the first record, after %s of group join", FormatSeconds(s.startup().Seconds()))
	}
	pubRate := rate(n, pub)
	r.rawPublish[t.Name] = pubRate
	out.add("publish", pubRate, "msgs/s")
	out.add("consume", rate(n, con), "msgs/s")
	return []Result{out}, nil
}

func nilIf(r *Result) []Result {
	if r == nil {
		return nil
	}
	return []Result{*r}
}

func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// pipeline: a prefilled outbox drained by the relay into the broker and
// by the worker (dedup plus a DB-only handler) into the business table.
func (r *runner) pipeline(ctx context.Context, t Target) ([]Result, error) {
	n := r.cfg.Messages
	db, err := newDatabase(ctx, r.cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	defer db.close()
	if err := fillBusiness(ctx, db, n, r.cfg.Size); err != nil {
		return nil, err
	}
	tp := topology()
	defer r.cleanup(t, tp)
	p, err := startPipeline(ctx, t, db, tp, parts{relay: true, worker: true, workers: r.cfg.Workers}, r.log)
	if err != nil {
		return nil, err
	}
	defer p.stop()
	start := time.Now()
	b := r.newBar("pipeline "+t.Name, n)
	var lag []Point
	var maxLag int64
	lastSample := time.Time{}
	err = waitFor(ctx, runTimeout, func() bool { return p.acked.Load() >= int64(n) }, func() {
		b.update(p.acked.Load())
		if time.Since(lastSample) >= 100*time.Millisecond {
			lastSample = time.Now()
			if left, err := db.unpublished(ctx); err == nil {
				lag = append(lag, Point{X: time.Since(start).Seconds(), Y: float64(left)})
				maxLag = max(maxLag, left)
			}
		}
	})
	elapsed := time.Since(start)
	b.finish(p.acked.Load())
	lag = append(lag, Point{X: elapsed.Seconds(), Y: 0})
	if err != nil {
		return nil, fmt.Errorf("%w: %d of %d handled", err, p.acked.Load(), n)
	}
	if err := p.stop(); err != nil {
		return nil, err
	}
	out := Result{Messages: n, Seconds: elapsed.Seconds(), Series: lag}
	th := rate(n, elapsed)
	out.add("throughput", th, "events/s")
	if raw, ok := r.rawPublish[t.Name]; ok && raw > 0 {
		out.add("pipeline/raw", th/raw, "")
	} else {
		out.Note = "no raw baseline in this run (add raw to --scenarios for the ratio)"
	}
	out.add("max outbox lag", float64(maxLag), "rows")
	out.add("duplicates", float64(p.dups.Load()), "")
	if sent, err := db.countSent(ctx); err == nil && sent != int64(n) {
		out.Note = strings.TrimPrefix(out.Note+fmt.Sprintf("; %d of %d business rows marked sent", sent, n), "; ")
	}
	return []Result{out}, nil
}

// ferryVariant is one setting of ferry's relay and worker in an
// end-to-end run.
type ferryVariant struct {
	name   string        // Result.Variant in the end-to-end scenario ("" for the default)
	mode   string        // outbox.RelayConfig.Mode
	batch  int           // worker.Config.BatchSize (0: one message per transaction)
	linger time.Duration // worker.Config.BatchLinger
}

// VariantWALBatch is the end-to-end scenario's Result.Variant of ferry
// with the WAL relay (outbox.RelayModeWAL) and the worker committing
// batches of up to WALBatchSize messages (worker.Config.BatchSize, a
// savepoint per message) cut after WALBatchLinger without a further
// delivery. The scenario's other row (Variant "") is the polling relay
// with one transaction per message.
const VariantWALBatch = "WAL + batched commits"

// The worker's batch in the VariantWALBatch runs: worker.Config.BatchSize
// and BatchLinger.
const (
	WALBatchSize   = 8
	WALBatchLinger = 2 * time.Millisecond
)

var (
	// ferryPoll is ferry as every other scenario runs it: the polling
	// relay, one worker transaction per message.
	ferryPoll = ferryVariant{mode: outbox.RelayModePoll}
	// ferryWALBatch is ferry with the WAL relay and batched worker
	// commits.
	ferryWALBatch = ferryVariant{name: VariantWALBatch, mode: outbox.RelayModeWAL, batch: WALBatchSize, linger: WALBatchLinger}
)

// note says how v differs from ferry's default settings ("" for none).
func (v ferryVariant) note() string {
	if v.batch <= 1 {
		return ""
	}
	return fmt.Sprintf("worker BatchSize %d, BatchLinger %s (one transaction per batch, a savepoint per message)", v.batch, v.linger)
}

// endToEnd: producers commit business row + outbox event while the relay
// and the worker run; throughput and CPU per 1,000 events of ferry,
// PostgreSQL and the broker, WAL bytes and commits per event. Two runs,
// one after the other: the polling relay with one worker transaction per
// message, then the WAL relay with batched worker commits
// (VariantWALBatch; "not supported" on a server that cannot stream its
// WAL, outbox.ErrWALUnavailable).
func (r *runner) endToEnd(ctx context.Context, t Target) ([]Result, error) {
	var out []Result
	for _, v := range []ferryVariant{ferryPoll, ferryWALBatch} {
		res, err := r.endToEndRun(ctx, t, v)
		if errors.Is(err, outbox.ErrWALUnavailable) {
			// A server without logical replication: a fact of the
			// server, not a failure of ferry.
			out = append(out, Result{Variant: v.name, RelayMode: v.mode, Status: statusUnsupported, Note: err.Error()})
			continue
		}
		if err != nil {
			if v.name != "" {
				err = fmt.Errorf("%s: %w", v.name, err)
			}
			return out, err
		}
		out = append(out, res)
	}
	return out, nil
}

// endToEndRun is one end-to-end run of ferry set up as v.
func (r *runner) endToEndRun(ctx context.Context, t Target, v ferryVariant) (Result, error) {
	n := r.cfg.Messages
	db, err := newDatabase(ctx, r.cfg.DatabaseURL)
	if err != nil {
		return Result{}, err
	}
	defer db.close()
	tp := topology()
	defer r.cleanup(t, tp)
	p, err := startPipeline(ctx, t, db, tp, parts{relay: true, worker: true, workers: r.cfg.Workers,
		mode: v.mode, batch: v.batch, linger: v.linger}, r.log)
	if err != nil {
		return Result{}, err
	}
	defer p.stop()
	pool, err := db.pool(ctx, producers)
	if err != nil {
		return Result{}, err
	}
	defer pool.Close()

	procs, note := r.processes(ctx, db, t)
	meter, err := startMeter(ctx, db.admin, procs)
	if err != nil {
		return Result{}, err
	}
	label := "end-to-end " + t.Name
	if v.name != "" {
		label += " " + v.name
	}
	b := r.newBar(label, n)
	start := time.Now()
	prodErr := make(chan error, 1)
	var produceTime time.Duration
	go func() {
		d, err := produceAll(ctx, pool, n, producers, r.cfg.Rate, r.cfg.Size, nil)
		produceTime = d
		prodErr <- err
	}()
	err = waitFor(ctx, runTimeout, func() bool { return p.acked.Load() >= int64(n) }, func() { b.update(p.acked.Load()) })
	elapsed := time.Since(start)
	b.finish(p.acked.Load())
	if perr := <-prodErr; perr != nil {
		return Result{}, perr
	}
	if err != nil {
		return Result{}, fmt.Errorf("%w: %d of %d handled", err, p.acked.Load(), n)
	}
	if err := p.stop(); err != nil {
		return Result{}, err
	}
	pool.Close()
	cost, err := meter.stop(ctx, db.admin)
	if err != nil {
		return Result{}, err
	}
	for _, s := range []string{v.note(), meter.note} {
		if s != "" {
			note = strings.TrimPrefix(note+"; "+s, "; ")
		}
	}
	out := Result{Variant: v.name, RelayMode: v.mode, Messages: n, Seconds: elapsed.Seconds(), Note: note}
	out.add("throughput", rate(n, elapsed), "events/s")
	out.add("produced", rate(n, produceTime), "events/s")
	out.add("duplicates", float64(p.dups.Load()), "")
	shares := make([]CPUShare, 0, len(cost.CPU))
	for _, c := range cost.CPU {
		shares = append(shares, CPUShare{Name: c.Name, CPU: c.CPU})
	}
	per := CPUPerThousand(shares, n)
	for _, s := range shares {
		if pv, ok := per[s.Name]; ok {
			out.add("CPU "+s.Name, pv, "s/1k events")
			delete(per, s.Name)
		}
	}
	out.add("CPU all", per["all"], "s/1k events")
	if meter.full != nil {
		out.add("WAL", float64(cost.WALBytes)/float64(n), "B/event")
		out.add("commits", float64(cost.Commits)/float64(n), "/event")
	}
	return out, nil
}

// processes are the process trees whose CPU end-to-end measures: this
// process (producers, relay and worker: ferry), the PostgreSQL server and
// the broker's server when it runs on this machine outside this process.
func (r *runner) processes(ctx context.Context, db *database, t Target) ([]runcost.Process, string) {
	procs := []runcost.Process{runcost.Self("ferry")}
	var notes []string
	if pg, err := runcost.Postgres(ctx, db.admin); err == nil {
		procs = append(procs, pg)
	} else {
		notes = append(notes, "no PostgreSQL CPU: "+err.Error())
	}
	if t.URL != "" {
		if l, err := runcost.Listener("broker", t.serverURL()); err != nil {
			notes = append(notes, "no "+t.Name+" CPU: "+err.Error())
		} else if l.PID == procs[0].PID {
			notes = append(notes, t.Name+" runs inside the ferry process: its CPU is in ferry's")
		} else {
			procs = append(procs, l)
		}
		if t.serverURL() != t.URL {
			notes = append(notes, "ferry's CPU includes the proxy its "+t.Name+" calls go through")
		}
	}
	return procs, strings.Join(notes, "; ")
}

// latency: commit-to-handled latency at fixed rates (200 and 1,000
// events/s, or --rate) with the polling relay, then at the highest of
// them with the WAL relay and batched worker commits (Variant "1000/s,
// WAL + batched commits"; "not supported" on a server that cannot stream
// its WAL).
func (r *runner) latency(ctx context.Context, t Target) ([]Result, error) {
	rates := []int{200, 1000}
	if r.cfg.Rate > 0 {
		rates = []int{r.cfg.Rate}
	}
	var out []Result
	for _, rt := range rates {
		res, err := r.latencyAt(ctx, t, rt, ferryPoll)
		if err != nil {
			return out, fmt.Errorf("at %d/s: %w", rt, err)
		}
		out = append(out, res)
	}
	rt := rates[len(rates)-1]
	res, err := r.latencyAt(ctx, t, rt, ferryWALBatch)
	switch {
	case errors.Is(err, outbox.ErrWALUnavailable):
		out = append(out, Result{Variant: latencyVariant(rt, ferryWALBatch), RelayMode: ferryWALBatch.mode, Status: statusUnsupported, Note: err.Error()})
	case err != nil:
		return out, fmt.Errorf("at %d/s, %s: %w", rt, ferryWALBatch.name, err)
	default:
		out = append(out, res)
	}
	return out, nil
}

// latencyVariant is the latency scenario's Result.Variant of a run at rt
// events/s of ferry set up as v: "1000/s", "1000/s, WAL + batched
// commits".
func latencyVariant(rt int, v ferryVariant) string {
	if v.name == "" {
		return fmt.Sprintf("%d/s", rt)
	}
	return fmt.Sprintf("%d/s, %s", rt, v.name)
}

// latencyAt is one latency run at rt events/s of ferry set up as v.
func (r *runner) latencyAt(ctx context.Context, t Target, rt int, v ferryVariant) (Result, error) {
	// Ten seconds at the rate, at most --messages events.
	n := max(min(r.cfg.Messages, rt*10), 50)
	const warm = 20
	db, err := newDatabase(ctx, r.cfg.DatabaseURL)
	if err != nil {
		return Result{}, err
	}
	defer db.close()
	// Indexed by outbox id (the message ID): a fresh database numbers
	// them from 1.
	size := n + warm + 16
	base := time.Now()
	committed := make([]atomic.Int64, size)
	handled := make([]atomic.Int64, size)
	stamp := func(ts []atomic.Int64, id int64) {
		if id > 0 && id < int64(size) {
			ts[id].CompareAndSwap(0, int64(time.Since(base)))
		}
	}
	tp := topology()
	defer r.cleanup(t, tp)
	p, err := startPipeline(ctx, t, db, tp, parts{relay: true, worker: true, workers: r.cfg.Workers,
		mode: v.mode, batch: v.batch, linger: v.linger,
		onHandled: func(m *broker.Message) {
			id, _ := strconv.ParseInt(m.ID, 10, 64)
			stamp(handled, id)
		}}, r.log)
	if err != nil {
		return Result{}, err
	}
	defer p.stop()
	pool, err := db.pool(ctx, producers)
	if err != nil {
		return Result{}, err
	}
	defer pool.Close()
	// Warm up: LISTEN set up, subscription running, pools and plans warm.
	if _, err := produceAll(ctx, pool, warm, producers, rt, r.cfg.Size, nil); err != nil {
		return Result{}, err
	}
	if err := waitFor(ctx, time.Minute, func() bool { return p.acked.Load() >= warm }, nil); err != nil {
		return Result{}, fmt.Errorf("warm-up: %w", err)
	}
	label := fmt.Sprintf("latency %s %s", t.Name, latencyVariant(rt, v))
	b := r.newBar(label, n)
	var mu sync.Mutex
	ids := make([]int64, 0, n)
	prodErr := make(chan error, 1)
	go func() {
		_, err := produceAll(ctx, pool, n, producers, rt, r.cfg.Size, func(id int64) {
			stamp(committed, id)
			mu.Lock()
			ids = append(ids, id)
			mu.Unlock()
		})
		prodErr <- err
	}()
	err = waitFor(ctx, runTimeout, func() bool { return p.acked.Load() >= int64(n+warm) }, func() { b.update(p.acked.Load() - warm) })
	b.finish(p.acked.Load() - warm)
	if perr := <-prodErr; perr != nil {
		return Result{}, perr
	}
	if err != nil {
		return Result{}, err
	}
	lat := make([]time.Duration, 0, len(ids))
	for _, id := range ids {
		if id <= 0 || id >= int64(size) || handled[id].Load() == 0 {
			return Result{}, fmt.Errorf("message %d: no handling time recorded", id)
		}
		lat = append(lat, time.Duration(handled[id].Load()-committed[id].Load()))
	}
	st := Summarize(lat)
	out := Result{Variant: latencyVariant(rt, v), RelayMode: v.mode, Messages: n, Seconds: time.Since(base).Seconds(), Latency: &st, Series: cdf(lat), Note: v.note()}
	out.add("p50", st.P50, "ms")
	out.add("p95", st.P95, "ms")
	out.add("p99", st.P99, "ms")
	out.add("max", st.Max, "ms")
	return out, p.stop()
}

// cdf returns at most 200 points (latency ms, fraction at most it) of
// sorted.
func cdf(sorted []time.Duration) []Point {
	n := len(sorted)
	if n == 0 {
		return nil
	}
	step := max(n/200, 1)
	var pts []Point
	for i := 0; i < n; i += step {
		pts = append(pts, Point{X: ms(sorted[i]), Y: float64(i+1) / float64(n)})
	}
	if pts[len(pts)-1].Y != 1 {
		pts = append(pts, Point{X: ms(sorted[n-1]), Y: 1})
	}
	return pts
}

// orderingKeys is K, the keys the ordering scenario spreads events over:
// fewer than the deliveries in flight (orderingPrefetch), so two events
// of one key can be handled at once.
const orderingKeys = 4

// orderingPrefetch is the subscription's prefetch in the ordering
// scenario: the worker's default (broker.DefaultPrefetch).
const orderingPrefetch = broker.DefaultPrefetch

// ordering: events over K keys published in order, consumed by 1 and 4
// concurrent consumers with and without the ordered subscription;
// per-key order violations.
func (r *runner) ordering(ctx context.Context, t Target) ([]Result, error) {
	n := min(r.cfg.Messages, 5000)
	var out []Result
	for _, workers := range []int{1, 4} {
		for _, ordered := range []bool{false, true} {
			res, err := r.orderingRun(ctx, t, n, workers, ordered)
			if err != nil {
				return out, fmt.Errorf("%d workers, ordered=%v: %w", workers, ordered, err)
			}
			out = append(out, res)
		}
	}
	return out, nil
}

func (r *runner) orderingRun(ctx context.Context, t Target, n, workers int, ordered bool) (Result, error) {
	variant := fmt.Sprintf("%d worker", workers)
	if workers > 1 {
		variant += "s"
	}
	if ordered {
		variant += ", ordered"
	}
	res := Result{Variant: variant, Messages: n}
	br, err := openBroker(ctx, t)
	if err != nil {
		return res, err
	}
	defer br.Close()
	tp := topology()
	defer r.cleanup(t, tp)
	if err := declare(ctx, br, tp); err != nil {
		return res, err
	}
	// Publish in order, one batch after the other: the sequence of a key
	// is its publish order.
	seqs := map[string]int{}
	batch := make([]*broker.Message, 0, relayBatch)
	created := broker.FormatTime(time.Now())
	for i := 1; i <= n; i++ {
		key := "key-" + strconv.Itoa(i%orderingKeys)
		seqs[key]++
		batch = append(batch, &broker.Message{ID: strconv.Itoa(i), Type: EventType, Key: key,
			Body:    []byte(strconv.Itoa(seqs[key])),
			Headers: map[string]string{broker.HeaderCreatedAt: created}})
		if len(batch) == relayBatch || i == n {
			if err := br.Publish(ctx, batch); err != nil {
				return res, fmt.Errorf("publish: %w", err)
			}
			batch = batch[:0]
		}
	}
	sub, err := br.Subscribe(ctx, tp.Queues[0].Name, broker.SubscribeOptions{Prefetch: orderingPrefetch, Ordered: ordered})
	if errors.Is(err, broker.ErrUnsupported) {
		res.Status, res.Note = statusUnsupported, err.Error()
		return res, nil
	}
	if err != nil {
		return res, fmt.Errorf("subscribe: %w", err)
	}
	defer sub.Close()
	var (
		mu      sync.Mutex
		counter = NewOrderCounter()
		done    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		first   error
	)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	b := r.newBar(fmt.Sprintf("ordering %s %s", t.Name, variant), n)
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for done.Load() < int64(n) {
				d, err := sub.Receive(rctx)
				if err != nil {
					if rctx.Err() == nil {
						errOnce.Do(func() { first = err })
					}
					return
				}
				m := d.Message()
				seq, _ := strconv.Atoi(string(m.Body))
				// A handler's work, 0 to 500 µs, then its effect: the
				// order of the effects is what a user sees.
				time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
				mu.Lock()
				counter.Observe(m.Key, seq)
				mu.Unlock()
				if err := d.Ack(context.WithoutCancel(rctx)); err != nil {
					errOnce.Do(func() { first = err })
					return
				}
				if done.Add(1) >= int64(n) {
					cancel()
				}
			}
		})
	}
	err = waitFor(ctx, runTimeout, func() bool { return done.Load() >= int64(n) || first != nil && rctx.Err() != nil }, func() { b.update(done.Load()) })
	cancel()
	wg.Wait()
	b.finish(done.Load())
	if first != nil {
		return res, first
	}
	if err != nil {
		return res, err
	}
	res.Seconds = time.Since(start).Seconds()
	res.add("violations", float64(counter.Violations()), "")
	res.add("handled", float64(counter.Seen()), "")
	res.Note = fmt.Sprintf("%d keys, prefetch %d; the adapter's Capabilities.Ordering is %q", orderingKeys, orderingPrefetch, br.Capabilities().Ordering)
	return res, nil
}

// Retry scenario settings.
const (
	retryDelay       = time.Second // requested with worker.RetryAfter on the first attempt
	retryMaxAttempts = 3           // the policy's attempts before the DLQ
)

// retry: every event asks for a retry after retryDelay on its first
// attempt and succeeds on its second; one in ten always fails and goes to
// the DLQ after retryMaxAttempts. Requested against observed delay, and
// attempts before the DLQ.
func (r *runner) retry(ctx context.Context, t Target) ([]Result, error) {
	n := min(r.cfg.Messages, 200)
	poison := max(n/10, 1)
	db, err := newDatabase(ctx, r.cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	defer db.close()
	if err := fillBusiness(ctx, db, n, r.cfg.Size); err != nil {
		return nil, err
	}
	var (
		mu       sync.Mutex
		failedAt = map[string]time.Time{} // first attempt settled
		observed []time.Duration
		attempts = map[string]int{} // of the poison messages
	)
	isPoison := func(id int64) bool { return id%10 == 0 && id/10 <= int64(poison) }
	handler := func(ctx context.Context, tx pgx.Tx, m *broker.Message) error {
		id, err := EventID(m.Body)
		if err != nil {
			return worker.Permanent(err)
		}
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		if isPoison(id) {
			attempts[m.ID]++
			return errors.New("bench: poison message, always fails")
		}
		if at, ok := failedAt[m.ID]; ok {
			observed = append(observed, now.Sub(at))
			_, err := tx.Exec(ctx, `UPDATE notifications SET status = 'sent', sent_at = now() WHERE id = $1`, id)
			return err
		}
		return worker.RetryAfter(errors.New("bench: retry requested"), retryDelay)
	}
	onOutcome := func(m *broker.Message, o worker.Outcome) {
		if o != worker.OutcomeRetry {
			return
		}
		mu.Lock()
		if _, ok := failedAt[m.ID]; !ok {
			failedAt[m.ID] = time.Now()
		}
		mu.Unlock()
	}
	tp := topology(retryDelay)
	defer r.cleanup(t, tp)
	p, err := startPipeline(ctx, t, db, tp, parts{relay: true, worker: true, workers: r.cfg.Workers,
		handler: handler, onOutcome: onOutcome,
		policy: worker.BackoffPolicy{MaxAttempts: retryMaxAttempts, Delays: []time.Duration{retryDelay}}}, errorsOnly(r.log))
	if err != nil {
		return nil, err
	}
	defer p.stop()
	good := n - countPoison(n, isPoison)
	poisonN := n - good
	b := r.newBar("retry "+t.Name, n)
	start := time.Now()
	err = waitFor(ctx, runTimeout, func() bool { return p.acked.Load() >= int64(good) && p.dead.Load() >= int64(poisonN) },
		func() { b.update(p.acked.Load() + p.dead.Load()) })
	b.finish(p.acked.Load() + p.dead.Load())
	if err != nil {
		return nil, fmt.Errorf("%w: %d acked of %d, %d dead of %d", err, p.acked.Load(), good, p.dead.Load(), poisonN)
	}
	if err := p.stop(); err != nil {
		return nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	req := make([]time.Duration, len(observed))
	for i := range req {
		req[i] = retryDelay
	}
	med, worst := DelayError(observed, req)
	slices.Sort(observed)
	total := 0
	for _, a := range attempts {
		total += a
	}
	out := Result{Messages: n, Seconds: time.Since(start).Seconds(),
		Note: fmt.Sprintf("requested %v on the first attempt of %d events; %d poison events, policy MaxAttempts %d", retryDelay, good, poisonN, retryMaxAttempts)}
	out.add("observed p50", ms(Percentile(observed, 50)), "ms")
	out.add("median error", med, "ms")
	out.add("max error", worst, "ms")
	if len(attempts) > 0 {
		out.add("attempts before DLQ", float64(total)/float64(len(attempts)), "")
	}
	out.add("dead", float64(p.dead.Load()), "")
	return []Result{out}, nil
}

func countPoison(n int, isPoison func(int64) bool) int {
	c := 0
	for i := 1; i <= n; i++ {
		if isPoison(int64(i)) {
			c++
		}
	}
	return c
}

// replay: can consumed history be read again, and how fast.
func (r *runner) replay(ctx context.Context, t Target) ([]Result, error) {
	br, err := openBroker(ctx, t)
	if err != nil {
		return nil, err
	}
	caps := br.Capabilities()
	_ = br.Close()
	rc, res, err := r.openRaw(ctx, t)
	if res != nil || err != nil {
		if res != nil && !caps.Replay {
			res.Note = "Capabilities.Replay is false"
		}
		return nilIf(res), err
	}
	defer rc.close()
	n := r.cfg.Messages
	if _, err := rc.publish(ctx, n, r.cfg.Size); err != nil {
		return nil, err
	}
	if _, err := rc.consume(ctx, n); err != nil {
		return nil, err
	}
	b := r.newBar("replay "+t.Name, n)
	d, err := rc.replay(ctx, n)
	if errors.Is(err, errNoReplay) {
		return []Result{{Status: statusUnsupported, Messages: n,
			Note: fmt.Sprintf("%s; ferry's adapter declares Capabilities.Replay=%v", strings.TrimPrefix(err.Error(), errNoReplay.Error()+": "), caps.Replay)}}, nil
	}
	if err != nil {
		return nil, err
	}
	b.finish(int64(n))
	out := Result{Messages: n, Seconds: d.Seconds(), Note: fmt.Sprintf("all %d acked messages read again from the start with the broker's own client; ferry's adapter declares Capabilities.Replay=%v", n, caps.Replay)}
	out.add("replay", rate(n, d), "msgs/s")
	return []Result{out}, nil
}
