package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/cmd/ferry/ferrycli"
	"github.com/ferrymq/ferry/internal/testenv"
)

// TestReplaySince: `ferry replay --since TIME --queue Q` on every broker.
// On a broker without the Replay capability it fails at once, naming the
// capability. On Kafka it resets the stopped queue's group to TIME: the
// queue reads again exactly the messages stored since then; with a worker
// (subscription) running it refuses and changes nothing.
func TestReplaySince(t *testing.T) {
	forEachBroker(t, func(t *testing.T, b string) {
		srv := brokerServers[b]
		queue := testenv.UniqueName("e2e-replay") + ".q"
		args := []string{"replay", "--broker", b, srv.urlFlag, srv.url(), "--queue", queue}
		opts := brokerOptions()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		br, err := ferrycli.OpenBroker(ctx, b, opts)
		if err != nil {
			testenv.Require(t, b)
		}
		require.NoError(t, err)
		defer br.Close()
		if !br.Capabilities().Replay {
			start := time.Now()
			code, _, errOut := ferry(t, append(args, "--since", "1h")...)
			require.NotEqual(t, 0, code)
			require.Contains(t, errOut, "Replay capability")
			require.Less(t, time.Since(start), 10*time.Second, "fails at once")
			return
		}
		tp := broker.Topology{Exchange: queue + "-ex", Queues: []broker.Queue{{Name: queue, Bindings: []string{"evt.#"}}}}
		require.NoError(t, br.Declare(ctx, tp))
		batch := func(prefix string) []*broker.Message {
			var ms []*broker.Message
			for i := range 5 {
				ms = append(ms, &broker.Message{ID: fmt.Sprint(prefix, i), Type: "evt.r", Key: fmt.Sprint("k", i), Body: []byte("{}")})
			}
			return ms
		}
		require.NoError(t, br.Publish(ctx, batch("old-")))
		time.Sleep(1500 * time.Millisecond)
		since := time.Now()
		time.Sleep(100 * time.Millisecond)
		require.NoError(t, br.Publish(ctx, batch("new-")))

		consume := func(n int) []string {
			sub, err := br.Subscribe(ctx, queue, broker.SubscribeOptions{})
			require.NoError(t, err)
			var ids []string
			for range n {
				rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
				d, err := sub.Receive(rctx)
				rcancel()
				require.NoError(t, err)
				ids = append(ids, d.Message().ID)
				require.NoError(t, d.Ack(ctx))
			}
			rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
			_, err = sub.Receive(rctx)
			rcancel()
			require.ErrorIs(t, err, context.DeadlineExceeded, "nothing more")
			time.Sleep(1500 * time.Millisecond) // the commit
			require.NoError(t, sub.Close())
			time.Sleep(time.Second) // the group empties
			return ids
		}
		require.Len(t, consume(10), 10)

		sinceArg := since.UTC().Format(time.RFC3339Nano)
		code, out, errOut := ferry(t, append(args, "--since", sinceArg)...)
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "read again 5 message(s)")
		ids := consume(5)
		for _, id := range ids {
			require.True(t, strings.HasPrefix(id, "new-"), "only messages since --since come again: %v", ids)
		}

		// A running consumer: refused, nothing changes.
		sub, err := br.Subscribe(ctx, queue, broker.SubscribeOptions{})
		require.NoError(t, err)
		defer sub.Close()
		time.Sleep(3 * time.Second) // joined
		code, _, errOut = ferry(t, append(args, "--since", sinceArg)...)
		require.NotEqual(t, 0, code)
		require.Contains(t, errOut, "stop the workers")
	})
}
