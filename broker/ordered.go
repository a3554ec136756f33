package broker

import (
	"context"
	"errors"
	"sync"
	"time"
)

// OrderedSubscription wraps sub so that it keeps per-key order as
// SubscribeOptions.Ordered describes: Receive hands out a delivery whose
// Message.Key is not empty only after the delivery of the same Key handed
// out before it was settled (Ack, Retry or DeadLetter, whatever the
// settle returned, except ErrAlreadyAcked); deliveries of other keys, and
// without a Key, are handed out at once. An adapter whose broker hands
// out deliveries in queue or stream order implements Ordered by returning
// OrderedSubscription(sub) from Subscribe.
//
// A goroutine receives from sub in the background and holds back the
// deliveries of busy keys; they count against the subscription's Prefetch
// and their broker ack deadline (SubscribeOptions.AckDeadline, where the
// broker has one) runs while they wait, so keep Prefetch times the
// handler's time below the ack deadline, or a held message is redelivered
// (a duplicate, which consumers deduplicate). Close stops the background
// receive and closes sub; deliveries received but not handed out stay
// unsettled and the broker redelivers them (at the latest when the broker
// is closed). Receive may be called from several goroutines at once and
// returns ErrClosed after Close.
func OrderedSubscription(sub Subscription) Subscription {
	ctx, cancel := context.WithCancel(context.Background())
	o := &orderedSub{
		sub:     sub,
		cancel:  cancel,
		busy:    map[string][]Delivery{},
		changed: make(chan struct{}),
		done:    make(chan struct{}),
	}
	go o.pump(ctx)
	return o
}

type orderedSub struct {
	sub    Subscription
	cancel context.CancelFunc
	done   chan struct{} // closed when pump returns

	mu      sync.Mutex
	busy    map[string][]Delivery // key handed out and not settled -> deliveries held behind it
	ready   []Delivery            // deliveries that may be handed out, in arrival order
	err     error                 // set when pump stopped: ErrClosed or sub's error
	changed chan struct{}         // closed and replaced when ready or err changes
}

var _ Subscription = (*orderedSub)(nil)

func (o *orderedSub) pump(ctx context.Context) {
	defer close(o.done)
	for {
		d, err := o.sub.Receive(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, context.Canceled) {
				err = ErrClosed
			}
			o.mu.Lock()
			o.err = err
			o.signal()
			o.mu.Unlock()
			return
		}
		o.admit(d)
	}
}

// signal wakes the waiting Receive calls; o.mu is held.
func (o *orderedSub) signal() {
	close(o.changed)
	o.changed = make(chan struct{})
}

func (o *orderedSub) admit(d Delivery) {
	key := d.Message().Key
	o.mu.Lock()
	defer o.mu.Unlock()
	if key == "" {
		o.ready = append(o.ready, d)
		o.signal()
		return
	}
	if held, inFlight := o.busy[key]; inFlight {
		o.busy[key] = append(held, d)
		return
	}
	o.busy[key] = nil
	o.ready = append(o.ready, &orderedDelivery{Delivery: d, o: o, key: key})
	o.signal()
}

// release is called once when the handed-out delivery of key was settled:
// the next one held behind it becomes ready.
func (o *orderedSub) release(key string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	held := o.busy[key]
	if len(held) == 0 {
		delete(o.busy, key)
		return
	}
	o.busy[key] = held[1:]
	o.ready = append(o.ready, &orderedDelivery{Delivery: held[0], o: o, key: key})
	o.signal()
}

// Receive implements Subscription.
func (o *orderedSub) Receive(ctx context.Context) (Delivery, error) {
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		o.mu.Lock()
		if len(o.ready) > 0 {
			d := o.ready[0]
			o.ready[0] = nil
			o.ready = o.ready[1:]
			o.mu.Unlock()
			return d, nil
		}
		if o.err != nil {
			err := o.err
			o.mu.Unlock()
			return nil, err
		}
		changed := o.changed
		o.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-changed:
		}
	}
}

// Close implements Subscription.
func (o *orderedSub) Close() error {
	o.cancel()
	err := o.sub.Close()
	<-o.done
	return err
}

// orderedDelivery releases its key when it is settled.
type orderedDelivery struct {
	Delivery
	o    *orderedSub
	key  string
	once sync.Once
}

func (d *orderedDelivery) settled(err error) error {
	if !errors.Is(err, ErrAlreadyAcked) {
		d.once.Do(func() { d.o.release(d.key) })
	}
	return err
}

// Ack implements Delivery.
func (d *orderedDelivery) Ack(ctx context.Context) error {
	return d.settled(d.Delivery.Ack(ctx))
}

// Retry implements Delivery.
func (d *orderedDelivery) Retry(ctx context.Context, delay time.Duration, reason string) error {
	return d.settled(d.Delivery.Retry(ctx, delay, reason))
}

// DeadLetter implements Delivery.
func (d *orderedDelivery) DeadLetter(ctx context.Context, reason string) error {
	return d.settled(d.Delivery.DeadLetter(ctx, reason))
}
