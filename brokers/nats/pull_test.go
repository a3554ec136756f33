package nats_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
)

// TestOneWaiterPullsThePrefetch: a consumer that receives one message at
// a time (as a worker whose goroutines take turns to gather a batch) gets
// a backlog in a few pull requests, each for the room the prefetch leaves,
// not in a pull request (a round trip to the server) per message. The
// pull requests are counted on their JetStream API subject, which a plain
// subscriber sees too.
func TestOneWaiterPullsThePrefetch(t *testing.T) {
	t.Parallel()
	tp := topology("natspull", "evt.pull")
	b := declared(t, tp)
	const n, prefetch = 40, 20
	var msgs []*broker.Message
	for i := 0; i < n; i++ {
		msgs = append(msgs, &broker.Message{ID: fmt.Sprint("m", i), Type: "evt.pull", Body: []byte("x")})
	}
	ctx := ctxFor(t, 30*time.Second)
	require.NoError(t, b.Publish(ctx, msgs))

	nc, err := natsgo.Connect(testenv.NATSURL())
	require.NoError(t, err)
	defer nc.Close()
	var (
		mu    sync.Mutex
		pulls []string // the request bodies, {"batch":N,...}
	)
	// The subject names the stream and the consumer, encoded from the
	// exchange's and the queue's names ("-" as "-h", "." as "_"); the
	// topology's unique base is in both.
	encoded := strings.ReplaceAll(strings.TrimSuffix(tp.Exchange, ".ex"), "-", "-h")
	ps, err := nc.Subscribe("$JS.API.CONSUMER.MSG.NEXT.>", func(m *natsgo.Msg) {
		if strings.Contains(m.Subject, encoded) {
			mu.Lock()
			pulls = append(pulls, string(m.Data))
			mu.Unlock()
		}
	})
	require.NoError(t, err)
	defer ps.Unsubscribe()
	require.NoError(t, nc.Flush())

	sub, err := b.Subscribe(ctx, tp.Queues[0].Name, broker.SubscribeOptions{Prefetch: prefetch})
	require.NoError(t, err)
	defer sub.Close()
	for i := 0; i < n; i++ {
		d := receive(t, sub, 10*time.Second)
		require.NoError(t, d.Ack(ctx))
	}
	require.NoError(t, nc.Flush())
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, pulls, "no pull request seen on the JetStream API subject")
	t.Logf("%d messages received one at a time in %d pull requests: %s", n, len(pulls), strings.Join(pulls, " "))
	require.LessOrEqual(t, len(pulls), n/4, "a pull request per message or nearly")
}
