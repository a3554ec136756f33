package broker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Priorities: the same idiom on every broker, a queue per level.
//
// A Queue with Priorities = N (2..MaxPriority+1) is declared as N queues:
// level 0 is the queue itself, level k its queue PriorityQueueName(name,
// k), "<name>.p<k>", each with its own retry levels and its own DLQ. A
// message of priority p (HeaderPriority, set by the relay from
// outbox.Event.Priority) travels with the Type PriorityType(p, type),
// "ferry-p<p>.<type>", which only the bindings of level min(p, N-1) match
// ("ferry-p<p>." before each of the queue's patterns); queues without
// priorities are bound to every priority's Type too, so that a message
// reaches every queue bound to its type whatever its priority. Topology.
// Expanded returns that topology; every adapter declares it. Prioritized
// merges the levels' subscriptions into one and gives every delivery its
// Type back without the prefix.
//
// What it guarantees: among the deliveries the levels' subscriptions
// have received and not yet handed out, Receive hands out the highest
// level's first (strict) or in proportion to Weights. It is not a global
// order: each level's subscription fetches up to its prefetch ahead, a
// level whose broker is slower to deliver (a Kafka consumer group still
// joining) is served as soon as it delivers, and retries come back to
// their level's queue. RabbitMQ's x-max-priority is not used: it is
// per-queue and cannot be changed on an existing queue (a declaration
// with another x-max-priority fails with PRECONDITION_FAILED), quorum
// queues keep only two levels (RabbitMQ docs, "Quorum Queues", message
// priority), and Kafka, NATS and SQS have no message priority at all, so
// one idiom holds everywhere.
const (
	// HeaderPriority carries the message's priority as a decimal string,
	// 1..MaxPriority; absent means 0, the lowest. The relay sets it from
	// outbox.Event.Priority and publishes the message with
	// PriorityType(p, Type).
	HeaderPriority = "x-priority"
	// MaxPriority is the highest priority a message may carry; a Queue
	// has at most MaxPriority+1 levels. A message whose priority is above
	// its queue's top level goes to the top level.
	MaxPriority = 4
	// PriorityPrefix starts the first word of a prioritised Type
	// (PriorityType); event types and binding patterns may not start with
	// it.
	PriorityPrefix = "ferry-p"
)

// PriorityType returns the Type a message of priority p (0..MaxPriority)
// travels with: typ itself for p <= 0, else "ferry-p<p>.<typ>".
func PriorityType(p int, typ string) string {
	if p <= 0 {
		return typ
	}
	return PriorityPrefix + strconv.Itoa(min(p, MaxPriority)) + "." + typ
}

// SplitPriorityType is the inverse of PriorityType: the priority (0 when
// t has no priority prefix) and the Type without it.
func SplitPriorityType(t string) (p int, typ string) {
	if !strings.HasPrefix(t, PriorityPrefix) {
		return 0, t
	}
	word, rest, ok := strings.Cut(t[len(PriorityPrefix):], ".")
	if !ok {
		return 0, t
	}
	n, err := strconv.Atoi(word)
	if err != nil || n < 1 || n > MaxPriority || strconv.Itoa(n) != word {
		return 0, t
	}
	return n, rest
}

// MessagePriority returns m's priority from HeaderPriority: 0 when the
// header is absent; an error naming the value when it is not a decimal
// 0..MaxPriority.
func MessagePriority(m *Message) (int, error) {
	v, ok := m.Headers[HeaderPriority]
	if !ok || v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > MaxPriority {
		return 0, fmt.Errorf("%s %q: want 0..%d", HeaderPriority, v, MaxPriority)
	}
	return n, nil
}

// PriorityQueueName returns the name of level (0..MaxPriority) of the
// queue named queue: queue itself for level 0, else "<queue>.p<level>".
func PriorityQueueName(queue string, level int) string {
	if level <= 0 {
		return queue
	}
	return queue + ".p" + strconv.Itoa(level)
}

// Levels returns the names of q's priority levels, lowest first: only
// q.Name when q has no priorities (Priorities below 2).
func (q Queue) Levels() []string {
	n := max(q.Priorities, 1)
	out := make([]string, n)
	for k := range n {
		out[k] = PriorityQueueName(q.Name, k)
	}
	return out
}

// Expanded returns the topology the adapters declare for t: each queue
// with Priorities >= 2 becomes one queue per level (see the package's
// "Priorities"), and, when any queue has priorities, every queue
// without them is also bound to each pattern with each priority's prefix.
// A topology without priorities is returned unchanged. t must be valid
// (Validate).
func (t Topology) Expanded() Topology {
	if !t.hasPriorities() {
		return t
	}
	out := Topology{Exchange: t.Exchange}
	for _, q := range t.Queues {
		if q.Priorities < 2 {
			e := q
			e.Bindings = slices.Clone(q.Bindings)
			if !slices.Contains(q.Bindings, "#") { // "#" takes every Type already
				e.Bindings = appendPrioritised(e.Bindings, q.Bindings, 1, MaxPriority)
			}
			out.Queues = append(out.Queues, e)
			continue
		}
		for k := range q.Priorities {
			e := Queue{Name: PriorityQueueName(q.Name, k), RetryDelays: q.RetryDelays}
			switch {
			case k == 0:
				e.Bindings = slices.Clone(q.Bindings)
			case k < q.Priorities-1:
				e.Bindings = appendPrioritised(nil, q.Bindings, k, k)
			default: // the top level takes every priority above it too
				e.Bindings = appendPrioritised(nil, q.Bindings, k, MaxPriority)
			}
			out.Queues = append(out.Queues, e)
		}
	}
	return out
}

// appendPrioritised appends to dst each pattern of bindings as the
// Types of priorities from..to travel (PriorityType of the pattern).
func appendPrioritised(dst, bindings []string, from, to int) []string {
	for p := from; p <= to; p++ {
		for _, b := range bindings {
			dst = append(dst, PriorityType(p, b))
		}
	}
	return dst
}

// hasPriorities reports whether a queue of t has priority levels.
func (t Topology) hasPriorities() bool {
	return slices.ContainsFunc(t.Queues, func(q Queue) bool { return q.Priorities >= 2 })
}

// validatePriorities is Validate's part for Queue.Priorities.
func validatePriorities(t Topology) error {
	names := map[string]string{}
	for _, q := range t.Queues {
		names[q.Name] = q.Name
	}
	prioritised := t.hasPriorities()
	for i, q := range t.Queues {
		for j, b := range q.Bindings {
			if strings.HasPrefix(b, PriorityPrefix) {
				return fmt.Errorf("broker: topology: Queues[%d].Bindings[%d] %q: words starting with %q are reserved for priorities", i, j, b, PriorityPrefix)
			}
			// A pattern led by a wildcard would match the priority
			// prefix word itself: "*.created" takes "ferry-p1.created"
			// (an event of type "created") and misses
			// "ferry-p1.order.created". Only "#" alone is safe: it takes
			// every Type either way.
			if first, _, _ := strings.Cut(b, "."); prioritised && q.Priorities < 2 && b != "#" && (first == "*" || first == "#") {
				return fmt.Errorf("broker: topology: Queues[%d].Bindings[%d] %q: in a topology with priorities no queue may bind a pattern whose first word is a wildcard (it would match the priority prefix word); bind \"#\" or start the pattern with a word", i, j, b)
			}
		}
		if q.Priorities == 0 || q.Priorities == 1 {
			continue
		}
		if q.Priorities < 0 || q.Priorities > MaxPriority+1 {
			return fmt.Errorf("broker: topology: Queues[%d].Priorities %d: want 0 (none) or 2..%d levels", i, q.Priorities, MaxPriority+1)
		}
		for j, b := range q.Bindings {
			if first, _, _ := strings.Cut(b, "."); first == "*" || first == "#" {
				return fmt.Errorf("broker: topology: Queues[%d].Bindings[%d] %q: a queue with priorities cannot bind a pattern whose first word is a wildcard (its level 0 would also take the higher levels' messages)", i, j, b)
			}
		}
		for _, n := range q.Levels()[1:] {
			if other, ok := names[n]; ok {
				return fmt.Errorf("broker: topology: Queues[%d] %q: its priority level %q is also a queue of the topology (%q)", i, q.Name, n, other)
			}
			names[n] = q.Name
		}
	}
	return nil
}

// Prioritized merges the subscriptions of a queue's priority levels,
// levels[k] being level k (Queue.Levels order, lowest first), into one
// Subscription, and gives every delivery's Message its Type without the
// priority prefix (SplitPriorityType; its Ack, Retry, DeadLetter and
// Extend act on the level's delivery). With one level it only does the
// latter, with no goroutine.
//
// weights nil or empty: strict, Receive hands out a delivery of the
// highest level that has one ready, so a level is served only while every
// higher level is empty. Otherwise weights[k] > 0 is level k's share: when
// several levels have deliveries ready, they are handed out in proportion
// to their weights (smooth weighted round robin), so no level starves.
// Each level's subscription keeps up to its prefetch in flight, held
// here until handed out; with several concurrent Receive callers each
// takes the best delivery held at its call. Close closes every level's subscription and returns
// the first error. Receive returns a level's error as it comes (ErrClosed
// after Close).
func Prioritized(levels []Subscription, weights []int) (Subscription, error) {
	if len(levels) == 0 {
		return nil, fmt.Errorf("broker: Prioritized: no subscription")
	}
	if len(weights) > 0 && len(weights) != len(levels) {
		return nil, fmt.Errorf("broker: Prioritized: %d weights for %d levels", len(weights), len(levels))
	}
	for k, w := range weights {
		if w <= 0 {
			return nil, fmt.Errorf("broker: Prioritized: weights[%d] %d: must be positive", k, w)
		}
	}
	if len(levels) == 1 {
		return &unprefixed{Subscription: levels[0]}, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &merged{levels: levels, weights: weights, cancel: cancel, done: make(chan struct{}),
		queued: make([][]received, len(levels)), credit: make([]int, len(levels)), arrived: make(chan struct{})}
	for k, s := range levels {
		m.wg.Add(1)
		go m.pump(ctx, k, s)
	}
	return m, nil
}

// received is one Receive's result from a level.
type received struct {
	d   Delivery
	err error
}

type merged struct {
	levels  []Subscription
	weights []int
	cancel  context.CancelFunc
	done    chan struct{}  // closed by Close
	wg      sync.WaitGroup // the pumps

	mu sync.Mutex
	// queued holds each level's received deliveries not yet handed out,
	// oldest first. It needs no bound of its own: a level's subscription
	// hands out at most its prefetch unsettled deliveries, so its pump
	// waits in Receive once that many are here or being handled.
	queued  [][]received
	arrived chan struct{} // closed (and replaced) when a delivery is queued
	credit  []int         // smooth weighted round robin state
	closed  bool
}

// pump receives from level k and queues each result. After an error
// other than ErrClosed it waits (100 ms, doubling up to 5 s) before the
// next Receive, so that a level whose broker keeps failing does not fill
// the queue with errors.
func (m *merged) pump(ctx context.Context, k int, s Subscription) {
	defer m.wg.Done()
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		d, err := s.Receive(ctx)
		if ctx.Err() != nil {
			// Closing: a delivery received now is not handed out and the
			// broker redelivers it (Subscription.Close).
			return
		}
		m.mu.Lock()
		m.queued[k] = append(m.queued[k], received{d, err})
		close(m.arrived)
		m.arrived = make(chan struct{})
		m.mu.Unlock()
		if errors.Is(err, ErrClosed) {
			return
		}
		if err == nil {
			backoff = 100 * time.Millisecond
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// Receive implements Subscription: it picks among every level's queued
// deliveries, so concurrent callers each get the best one queued at the
// time of their call.
func (m *merged) Receive(ctx context.Context) (Delivery, error) {
	for {
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			return nil, ErrClosed
		}
		if k := m.pick(); k >= 0 {
			r := m.queued[k][0]
			m.queued[k][0] = received{}
			m.queued[k] = m.queued[k][1:]
			m.mu.Unlock()
			return m.out(r)
		}
		arrived := m.arrived
		m.mu.Unlock()
		select {
		case <-arrived:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-m.done:
			return nil, ErrClosed
		}
	}
}

// pick chooses among the levels with a queued delivery: the highest one
// (strict), or by smooth weighted round robin; -1 when none has one.
// m.mu is held.
func (m *merged) pick() int {
	if len(m.weights) == 0 {
		for k := len(m.queued) - 1; k >= 0; k-- {
			if len(m.queued[k]) > 0 {
				return k
			}
		}
		return -1
	}
	total, best := 0, -1
	for k := range m.queued {
		if len(m.queued[k]) == 0 {
			continue
		}
		m.credit[k] += m.weights[k]
		total += m.weights[k]
		if best < 0 || m.credit[k] > m.credit[best] {
			best = k
		}
	}
	if best >= 0 {
		m.credit[best] -= total
	}
	return best
}

func (m *merged) out(r received) (Delivery, error) {
	if r.err != nil {
		return nil, r.err
	}
	return unprefix(r.d), nil
}

// Close implements Subscription.
func (m *merged) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	close(m.done)
	m.mu.Unlock()
	var first error
	for _, s := range m.levels {
		if err := s.Close(); err != nil && first == nil {
			first = err
		}
	}
	m.cancel()
	m.wg.Wait()
	// Deliveries pumped and not handed out are left to the broker:
	// unsettled, they are redelivered.
	return first
}

// unprefixed is a single level's subscription with the Type unprefixed.
type unprefixed struct{ Subscription }

func (u *unprefixed) Receive(ctx context.Context) (Delivery, error) {
	d, err := u.Subscription.Receive(ctx)
	if err != nil {
		return nil, err
	}
	return unprefix(d), nil
}

// unprefix returns d itself when its Type has no priority prefix, else d
// with a Message whose Type has none.
func unprefix(d Delivery) Delivery {
	msg := d.Message()
	p, typ := SplitPriorityType(msg.Type)
	if p == 0 {
		return d
	}
	c := *msg
	c.Type = typ
	return &levelDelivery{Delivery: d, msg: &c}
}

// levelDelivery is a delivery whose Message has its Type without the
// priority prefix; settling it settles the level's delivery.
type levelDelivery struct {
	Delivery
	msg *Message
}

func (l *levelDelivery) Message() *Message { return l.msg }
