package nats_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/nats"
	"github.com/ferrymq/ferry/internal/testenv"
)

// TestStreamFullIsOutage (issue 16): a stream that refuses new messages
// because it is full (an operator's MaxMsgs with DiscardNew: JetStream
// answers "maximum messages exceeded", err_code 10077) refuses them for
// the stream's state, not for what they are: in one Publish of ten
// messages, the five the stream took are confirmed and not listed, and
// the five it refused fail with an outage error (broker.IsMessageFault
// false), so the relay waits for the stream to drain instead of parking
// good rows and charging them attempts.
func TestStreamFullIsOutage(t *testing.T) {
	ctx := ctxFor(t, 30*time.Second)
	tp := topology("full", "evt.full")
	b := declared(t, tp)

	js, st := streamOf(ctx, t, tp)
	cfg := st.CachedInfo().Config
	cfg.MaxMsgs, cfg.Discard = 5, jetstream.DiscardNew
	_, err := js.UpdateStream(ctx, cfg)
	require.NoError(t, err)

	var batch []*broker.Message
	for i := range 10 {
		batch = append(batch, &broker.Message{ID: fmt.Sprint("full-", i), Type: "evt.full", Body: []byte("x")})
	}
	err = b.Publish(ctx, batch)
	t.Logf("publish into a stream with room for 5: %v", err)
	var pe *broker.PublishError
	require.ErrorAs(t, err, &pe)
	require.Len(t, pe.Failed, 5, "the five the stream took are confirmed and not listed")
	for _, f := range pe.Failed {
		require.False(t, broker.IsMessageFault(f.Err), "a full stream is not the message's fault: %v", f.Err)
	}
}

// streamOf connects to the test NATS server and returns its JetStream
// context and the stream behind tp's exchange (declared before); the
// connection closes when the test ends.
func streamOf(ctx context.Context, t *testing.T, tp broker.Topology) (jetstream.JetStream, jetstream.Stream) {
	t.Helper()
	nc, err := natsgo.Connect(testenv.NATSURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	st, err := js.Stream(ctx, nats.StreamName(tp.Exchange))
	require.NoError(t, err)
	return js, st
}
