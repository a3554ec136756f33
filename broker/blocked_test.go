package broker_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
)

// A *BlockedError is ErrBlocked and its cause, gives the broker's reason
// through BlockedReason (also inside a *PublishError and wrapped with %w)
// and is never a message fault, even when its cause is one.
func TestBlockedReason(t *testing.T) {
	err := fmt.Errorf("adapter: publish 7: %w", broker.Blocked("low on memory", context.DeadlineExceeded))
	require.ErrorIs(t, err, broker.ErrBlocked)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, "adapter: publish 7: broker: blocked, no room on the broker: low on memory (context deadline exceeded)", err.Error())
	r, ok := broker.BlockedReason(err)
	require.True(t, ok)
	require.Equal(t, "low on memory", r)
	r, ok = broker.BlockedReason(&broker.PublishError{Failed: []broker.FailedMessage{
		{Index: 0, ID: "1", Err: errors.New("other")}, {Index: 1, ID: "2", Err: err}}})
	require.True(t, ok)
	require.Equal(t, "low on memory", r)
	r, ok = broker.BlockedReason(fmt.Errorf("x: %w", broker.ErrBlocked))
	require.True(t, ok)
	require.Equal(t, "x: broker: blocked, no room on the broker", r)

	require.False(t, broker.IsMessageFault(broker.Blocked("full", broker.ErrNacked)))
	for _, e := range []error{nil, context.DeadlineExceeded, broker.ErrNacked, &broker.PublishError{Failed: []broker.FailedMessage{{ID: "1", Err: broker.ErrUnroutable}}}} {
		_, ok := broker.BlockedReason(e)
		require.False(t, ok, "%v", e)
	}
}
