package sqs_test

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/sqs"
)

// TestBufferedMessageReceivedAgain: messages a subscription has received
// but not handed out become visible again (their visibility timeout ran
// out before the heartbeat, as on a stalled machine) and the next poll
// receives them again. Each is still handed out once, with the newest
// receipt handle (the only one SQS promises to delete with), and its Ack
// deletes it: nothing comes back afterwards.
func TestBufferedMessageReceivedAgain(t *testing.T) {
	tp := topology("lapse", "evt.lapse")
	b := declaredRaw(t, config(), tp)
	ids := []string{"l1", "l2", "l3"}
	for _, id := range ids {
		require.NoError(t, b.Publish(ctxFor(t, 30*time.Second), []*broker.Message{{ID: id, Type: "evt.lapse", Body: []byte(id)}}))
	}
	sub := subscribe(t, b, tp.Queues[0].Name, broker.SubscribeOptions{Prefetch: 10})
	require.Eventually(t, func() bool { return len(sqs.BufferedReceipts(sub)) == len(ids) }, 20*time.Second, 50*time.Millisecond,
		"the subscription buffers the published messages")

	old, err := sqs.LapseBuffered(ctxFor(t, 30*time.Second), sub)
	require.NoError(t, err)
	require.Len(t, old, len(ids))
	var now []string
	require.Eventually(t, func() bool {
		now = sqs.BufferedReceipts(sub)
		for _, r := range now {
			if slices.Contains(old, r) {
				return false
			}
		}
		return len(now) >= len(ids)
	}, 20*time.Second, 50*time.Millisecond, "the poll receives the lapsed messages again")
	require.Len(t, now, len(ids), "a message received again replaces its buffered copy: %v", now)

	got := drain(t, sub, 4*time.Second)
	require.Equal(t, map[string]int{"l1": 1, "l2": 1, "l3": 1}, got, "each message handed out once")
	again := drain(t, subscribe(t, b, tp.Queues[0].Name, broker.SubscribeOptions{AckDeadline: time.Second}), 4*time.Second)
	require.Empty(t, again, "the Acks, with the newest receipts, deleted the messages")
}
