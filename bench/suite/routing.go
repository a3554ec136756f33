package suite

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferrymq/ferry/broker"
)

// routingQueue is one queue of the routing scenario: a name suffix and its
// bindings in ferry's syntax (AMQP 0-9-1 topic rules: '*' one word, '#'
// zero or more).
type routingQueue struct {
	suffix   string
	bindings []string
}

// routingQueues are the routing scenario's queues: an exact binding, '*'
// and '#' in every position ferry's syntax allows, and a queue with two
// bindings that a message of one type matches only once.
var routingQueues = []routingQueue{
	{"exact", []string{"order.created"}},
	{"star-last", []string{"order.*"}},
	{"hash-last", []string{"order.#"}},
	{"star-first", []string{"*.created"}},
	{"hash-first", []string{"#.created"}},
	{"all", []string{"#"}},
	{"two-bindings", []string{"user.created", "audit.#"}},
}

// routingType is one published event type and the queues (suffixes)
// that must receive it.
type routingType struct {
	typ    string
	queues []string
}

// routingTypes are the published event types, in turn, each with the
// queues that must receive it, worked out by hand from the AMQP 0-9-1
// topic rules (not by ferry's matcher, which TestRoutingTable checks
// against this table).
var routingTypes = []routingType{
	{"order.created", []string{"exact", "star-last", "hash-last", "star-first", "hash-first", "all"}},
	{"order.paid", []string{"star-last", "hash-last", "all"}},
	{"order.item.added", []string{"hash-last", "all"}},
	{"order", []string{"hash-last", "all"}}, // '#' matches zero words
	{"user.created", []string{"star-first", "hash-first", "all", "two-bindings"}},
	{"audit.order.created", []string{"hash-first", "all", "two-bindings"}},
}

// routingQuiet is how long the routing scenario waits for a further
// delivery before it counts what has not arrived as missing; it also
// waits that long after the last expected delivery for misrouted ones.
const routingQuiet = 5 * time.Second

// routingTopology is the routing scenario's topology on a fresh exchange,
// without the queues named in skip.
func routingTopology(skip []string) broker.Topology {
	ex := uniqueName("bench")
	tp := broker.Topology{Exchange: ex}
	for _, q := range routingQueues {
		if !slices.Contains(skip, q.suffix) {
			tp.Queues = append(tp.Queues, broker.Queue{Name: ex + "." + q.suffix, Bindings: q.bindings, RetryDelays: []time.Duration{time.Second}})
		}
	}
	return tp
}

// routing: queues bound with exact, '*' and '#' patterns; a known mix of
// types published through ferry's adapter; what each queue received
// against what the patterns say (misrouted and missing must be 0), and
// the publish rate against a single exactly bound queue's.
func (r *runner) routing(ctx context.Context, t Target) ([]Result, error) {
	n := min(r.cfg.Messages, 3000)
	n -= n % len(routingTypes)
	n = max(n, len(routingTypes))
	res := Result{Messages: n}
	br, err := openBroker(ctx, t)
	if err != nil {
		return nil, err
	}
	defer br.Close()

	// Declare; a binding the broker refuses (ErrUnsupported) is reported
	// and its queue left out, the rest still measured.
	var skipped []string
	var refused []string
	tp := routingTopology(nil)
	for {
		err := declare(ctx, br, tp)
		if err == nil {
			break
		}
		if !errors.Is(err, broker.ErrUnsupported) || len(skipped) == len(routingQueues)-1 {
			return nil, fmt.Errorf("declare: %w", err)
		}
		q := refusedQueue(err)
		if q == "" || slices.Contains(skipped, q) {
			return nil, fmt.Errorf("declare: %w", err)
		}
		skipped = append(skipped, q)
		refused = append(refused, err.Error())
		r.cleanup(t, tp)
		tp = routingTopology(skipped)
	}
	defer r.cleanup(t, tp)

	type counts struct {
		mu       sync.Mutex
		byType   map[string]int
		seen     map[string]bool
		dups     int
		received atomic.Int64
	}
	queues := map[string]*counts{}
	for _, q := range tp.Queues {
		queues[strings.TrimPrefix(q.Name, tp.Exchange+".")] = &counts{byType: map[string]int{}, seen: map[string]bool{}}
	}
	expected := 0
	for _, rt := range routingTypes {
		for _, q := range rt.queues {
			if queues[q] != nil {
				expected += n / len(routingTypes)
			}
		}
	}

	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		first    error
		total    atomic.Int64
		lastNano atomic.Int64
	)
	fail := func(err error) {
		errOnce.Do(func() { first = err })
		cancel()
	}
	for suffix, c := range queues {
		sub, err := br.Subscribe(ctx, tp.Exchange+"."+suffix, broker.SubscribeOptions{Prefetch: 50})
		if err != nil {
			cancel()
			wg.Wait()
			return nil, fmt.Errorf("subscribe %s: %w", suffix, err)
		}
		defer sub.Close()
		wg.Go(func() {
			for {
				d, err := sub.Receive(rctx)
				if err != nil {
					if rctx.Err() == nil {
						fail(fmt.Errorf("receive %s: %w", suffix, err))
					}
					return
				}
				m := d.Message()
				c.mu.Lock()
				if c.seen[m.ID] {
					c.dups++
				} else {
					c.seen[m.ID] = true
					c.byType[m.Type]++
					total.Add(1)
				}
				c.mu.Unlock()
				lastNano.Store(time.Now().UnixNano())
				if err := d.Ack(context.WithoutCancel(rctx)); err != nil {
					fail(fmt.Errorf("ack %s: %w", suffix, err))
					return
				}
			}
		})
	}

	b := r.newBar("routing "+t.Name, expected)
	start := time.Now()
	lastNano.Store(start.UnixNano())
	pub, err := publishTypes(ctx, br, n, r.cfg.Size, func(i int) string { return routingTypes[i%len(routingTypes)].typ })
	if err != nil {
		cancel()
		wg.Wait()
		return nil, fmt.Errorf("publish: %w", err)
	}
	// Wait for every expected delivery, then routingQuiet more for
	// misrouted ones; or until nothing arrived for routingQuiet (a
	// subscription's first delivery may take longer: a consumer group's
	// join).
	published := time.Now()
	var done time.Time
	werr := waitFor(ctx, runTimeout, func() bool {
		if first != nil {
			return true
		}
		last := time.Unix(0, lastNano.Load())
		if total.Load() >= int64(expected) && done.IsZero() {
			done = last
		}
		quiet := routingQuiet
		if total.Load() == 0 {
			quiet = 6 * routingQuiet
		}
		if last.Before(published) {
			last = published
		}
		return time.Since(last) > quiet
	}, func() { b.update(total.Load()) })
	cancel()
	wg.Wait()
	b.finish(total.Load())
	if first != nil {
		return nil, first
	}
	if werr != nil {
		return nil, werr
	}
	if done.IsZero() {
		done = time.Unix(0, lastNano.Load())
	}

	misrouted, missing, dups := 0, 0, 0
	var detail []string
	for _, q := range routingQueues {
		c := queues[q.suffix]
		if c == nil {
			detail = append(detail, fmt.Sprintf("%s %s: refused", q.suffix, strings.Join(q.bindings, ",")))
			continue
		}
		got, want := 0, 0
		for _, rt := range routingTypes {
			k := c.byType[rt.typ]
			got += k
			if slices.Contains(rt.queues, q.suffix) {
				want += n / len(routingTypes)
				missing += max(n/len(routingTypes)-k, 0)
			} else {
				misrouted += k
			}
		}
		for typ, k := range c.byType {
			if !slices.ContainsFunc(routingTypes, func(rt routingType) bool { return rt.typ == typ }) {
				misrouted += k
			}
		}
		dups += c.dups
		detail = append(detail, fmt.Sprintf("%s %s: %d/%d", q.suffix, strings.Join(q.bindings, ","), got, want))
	}
	res.add("misrouted", float64(misrouted), "")
	res.add("missing", float64(missing), "")
	res.add("duplicates", float64(dups), "")
	res.add("refused bindings", float64(len(skipped)), "")
	res.add("copies", float64(expected), "")
	res.add("publish", rate(n, pub), "msgs/s")
	res.add("delivered", rate(int(total.Load()), done.Sub(start)), "copies/s")
	res.Seconds = done.Sub(start).Seconds()

	// The cost of routing: the same number of messages published to a
	// topology of one exactly bound queue.
	single, err := r.singleQueuePublish(ctx, t, n)
	if err != nil {
		return nil, fmt.Errorf("single-queue publish: %w", err)
	}
	if single > 0 {
		res.add("single-queue publish", single, "msgs/s")
		res.add("routed/single", rate(n, pub)/single, "")
	}
	res.Note = fmt.Sprintf("%d types in turn, %d messages, %d queues; received/expected per queue: %s",
		len(routingTypes), n, len(tp.Queues), strings.Join(detail, "; "))
	if len(refused) > 0 {
		res.Note += "; Declare refused: " + strings.Join(refused, "; ")
	}
	return []Result{res}, nil
}

// refusedQueue names the routing queue whose binding err (from Declare,
// wrapping broker.ErrUnsupported) refuses: the one whose name or binding
// the error quotes.
func refusedQueue(err error) string {
	msg := err.Error()
	for _, q := range routingQueues {
		if strings.Contains(msg, "."+q.suffix+" ") || strings.Contains(msg, "."+q.suffix+":") {
			return q.suffix
		}
	}
	for _, q := range routingQueues {
		for _, b := range q.bindings {
			if strings.Contains(msg, strconv.Quote(b)) {
				return q.suffix
			}
		}
	}
	return ""
}

// publishTypes publishes n messages of a size-byte body through br in batches of relayBatch,
// message i (0-based) of type typ(i), and returns the time it took.
func publishTypes(ctx context.Context, br broker.Broker, n, size int, typ func(i int) string) (time.Duration, error) {
	body := EventBody(1, size)
	created := broker.FormatTime(time.Now())
	batch := make([]*broker.Message, 0, relayBatch)
	start := time.Now()
	for i := 0; i < n; i++ {
		batch = append(batch, &broker.Message{ID: strconv.Itoa(i + 1), Type: typ(i), Key: "user-" + strconv.Itoa(i%100),
			Body: body, Headers: map[string]string{broker.HeaderCreatedAt: created}})
		if len(batch) == relayBatch || i == n-1 {
			if err := br.Publish(ctx, batch); err != nil {
				return 0, err
			}
			batch = batch[:0]
		}
	}
	return time.Since(start), nil
}

// singleQueuePublish publishes n messages of EventType to a fresh
// topology of one queue bound exactly to it, through a new adapter of t,
// and returns the rate (msgs/s).
func (r *runner) singleQueuePublish(ctx context.Context, t Target, n int) (float64, error) {
	br, err := openBroker(ctx, t)
	if err != nil {
		return 0, err
	}
	defer br.Close()
	tp := topology()
	defer r.cleanup(t, tp)
	if err := declare(ctx, br, tp); err != nil {
		return 0, err
	}
	d, err := publishTypes(ctx, br, n, r.cfg.Size, func(int) string { return EventType })
	if err != nil {
		return 0, err
	}
	return rate(n, d), nil
}
