package broker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
)

// fakeCalls is a SendFunc over a batch of n messages of which the ones in
// poison make every call carrying them be refused as a whole; down, when
// set, fails every call carrying the index with an outage error. It
// records the calls made and what was accepted.
type fakeCalls struct {
	poison   map[int]bool
	down     map[int]bool
	calls    [][]int
	accepted map[int]int
	order    []int // accepted indexes, in the order of acceptance
}

var errDown = errors.New("HTTP 500")

func (f *fakeCalls) send(_ context.Context, idx []int) map[int]error {
	f.calls = append(f.calls, slices.Clone(idx))
	out := map[int]error{}
	for _, i := range idx {
		if f.poison[i] {
			for _, j := range idx {
				out[j] = broker.RefusedCall(fmt.Errorf("HTTP 400 for the call (culprit %d)", i))
			}
			return out
		}
		if f.down[i] {
			for _, j := range idx {
				out[j] = errDown
			}
			return out
		}
	}
	for _, i := range idx {
		f.accepted[i]++
		f.order = append(f.order, i)
	}
	return out
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// SendSplitting finds the one message at fault among 100 in about
// 2·log2(100) calls, fails it alone as a message fault and sends each
// other message exactly once.
func TestSendSplittingFindsOnePoison(t *testing.T) {
	f := &fakeCalls{poison: map[int]bool{37: true}, accepted: map[int]int{}}
	failed := broker.SendSplitting(context.Background(), seq(100), f.send)
	require.Len(t, failed, 1)
	require.True(t, broker.IsMessageFault(failed[37]))
	require.ErrorIs(t, failed[37], broker.ErrInvalidMessage)
	var rc *broker.RefusedCallError
	require.False(t, errors.As(failed[37], &rc), "the refusal is the message's own error, no RefusedCallError left")
	require.Len(t, f.accepted, 99)
	for i, n := range f.accepted {
		require.Equal(t, 1, n, "message %d sent once", i)
	}
	require.LessOrEqual(t, len(f.calls), 1+2*7, "calls: %v", f.calls)
	t.Logf("%d calls for one poison among 100", len(f.calls))
}

// Several poison messages fail each alone; the halves are sent in order
// (first half first), so a queue keeps the order of the accepted ones.
func TestSendSplittingSeveralPoisonsInOrder(t *testing.T) {
	f := &fakeCalls{poison: map[int]bool{0: true, 5: true, 6: true}, accepted: map[int]int{}}
	failed := broker.SendSplitting(context.Background(), seq(10), f.send)
	require.Len(t, failed, 3)
	for _, i := range []int{0, 5, 6} {
		require.True(t, broker.IsMessageFault(failed[i]))
	}
	require.Len(t, f.accepted, 7)
	require.True(t, slices.IsSorted(f.order), "accepted in batch order: %v", f.order)
}

// An outage error is not split: its messages keep it (not a message
// fault), and a call is never repeated for them.
func TestSendSplittingOutageNotSplit(t *testing.T) {
	f := &fakeCalls{down: map[int]bool{3: true}, accepted: map[int]int{}}
	failed := broker.SendSplitting(context.Background(), seq(8), f.send)
	require.Len(t, f.calls, 1)
	require.Len(t, failed, 8)
	for _, err := range failed {
		require.Same(t, errDown, err)
		require.False(t, broker.IsMessageFault(err))
	}
	require.Same(t, errDown, broker.PublishResult(make([]*broker.Message, 8), failed), "one error for all: returned itself")
}

// With ctx done, a refused group is not split further and its messages
// fail with ctx's error, never as message faults (they may be innocent).
func TestSendSplittingStopsWithCtx(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	f := &fakeCalls{poison: map[int]bool{2: true}, accepted: map[int]int{}}
	failed := broker.SendSplitting(ctx, seq(8), func(c context.Context, idx []int) map[int]error {
		cancel()
		return f.send(c, idx)
	})
	require.Len(t, failed, 8)
	for _, err := range failed {
		require.ErrorIs(t, err, context.Canceled)
		require.False(t, broker.IsMessageFault(err))
	}
}

// PublishResult lists only the failed messages, in index order, with IDs.
func TestPublishResult(t *testing.T) {
	msgs := []*broker.Message{{ID: "a"}, {ID: "b"}, {ID: "c"}}
	require.NoError(t, broker.PublishResult(msgs, nil))
	err := broker.PublishResult(msgs, map[int]error{2: errDown, 0: broker.ErrNacked})
	var pe *broker.PublishError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, []broker.FailedMessage{{Index: 0, ID: "a", Err: broker.ErrNacked}, {Index: 2, ID: "c", Err: errDown}}, pe.Failed)
}
