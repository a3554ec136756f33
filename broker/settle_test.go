package broker_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
)

// TestSettleReason: the classification is bounded and follows the
// wrapped errors; an adapter's SettleFault wins over the generic rules.
func TestSettleReason(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{fmt.Errorf("x: %w", broker.ErrClosed), broker.ReasonClosed},
		{broker.ErrAlreadyAcked, broker.ReasonAlreadySettled},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), broker.ReasonTimeout},
		{context.Canceled, broker.ReasonCanceled},
		{&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, broker.ReasonConnection},
		{fmt.Errorf("read: %w", io.EOF), broker.ReasonConnection},
		{errors.New("something"), broker.ReasonOther},
		{fmt.Errorf("sqs: ack: %w", broker.SettleFault(broker.ReasonExpired, errors.New("ReceiptHandleIsInvalid"))), broker.ReasonExpired},
		{broker.SettleFault(broker.ReasonConnection, broker.ErrClosed), broker.ReasonConnection},
	} {
		got := broker.SettleReason(c.err)
		require.Equal(t, c.want, got, "%v", c.err)
		if c.err != nil {
			require.Contains(t, broker.SettleReasons, got)
		}
	}
	require.Nil(t, broker.SettleFault(broker.ReasonOther, nil))
	err := broker.SettleFault(broker.ReasonExpired, broker.ErrAlreadyAcked)
	require.ErrorIs(t, err, broker.ErrAlreadyAcked)
	require.Equal(t, broker.ErrAlreadyAcked.Error(), err.Error())
}

// TestReportSettleFailure: a report reaches the ctx's observer, with the
// reason derived from the error; without an observer it does nothing.
func TestReportSettleFailure(t *testing.T) {
	broker.ReportSettleFailure(context.Background(), broker.SettleFailure{Op: broker.SettleAck}) // no observer: no-op
	var got []broker.SettleFailure
	ctx := broker.WithSettleObserver(context.Background(), func(f broker.SettleFailure) { got = append(got, f) })
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	broker.ReportSettleFailure(ctx, broker.SettleFailure{Op: broker.SettleAck, Err: context.DeadlineExceeded, Recovered: true})
	require.Len(t, got, 1)
	require.Equal(t, broker.ReasonTimeout, got[0].Reason)
	require.True(t, got[0].Recovered)
}
