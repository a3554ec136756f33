package kafka

import (
	"context"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
)

// A produce request is sent again only when it is known not to be stored
// (see retriable): sending again one that may be stored would make a copy
// per retry.
func TestRetriableOnlyWhenNotStored(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{kafkago.NotLeaderForPartition, true},
		{kafkago.LeaderNotAvailable, true},
		{kafkago.NotEnoughReplicas, true},
		{fmt.Errorf("kafka.(*Client).Produce: %w", kafkago.NotLeaderForPartition), true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		// The leader appended the records before these.
		{kafkago.NotEnoughReplicasAfterAppend, false},
		{kafkago.RequestTimedOut, false},
		// write declares a missing topic again.
		{kafkago.UnknownTopicOrPartition, false},
		// The request may have been written before the connection broke.
		{&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, false},
		{&net.OpError{Op: "write", Net: "tcp", Err: syscall.EPIPE}, false},
		{io.ErrUnexpectedEOF, false},
		{context.DeadlineExceeded, false},
		{kafkago.MessageSizeTooLarge, false},
	} {
		require.Equal(t, c.want, retriable(c.err), "%v", c.err)
	}
}
