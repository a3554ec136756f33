package nats_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/roomtest"
	"github.com/ferrymq/ferry/outbox"
)

// TestNoRoomFullStream (issue 29): a stream of this test only, filled up
// to its MaxBytes with DiscardNew, refuses the relay's messages with
// "maximum bytes exceeded" (err_code 10077), which the adapter reports
// as broker.ErrBlocked; the relay says it is blocked, once, holds its
// rows and publishes them all once the stream has room again
// (roomtest.Run), with the polling relay and with the WAL relay.
func TestNoRoomFullStream(t *testing.T) {
	for _, mode := range []string{outbox.RelayModePoll, outbox.RelayModeWAL} {
		t.Run(mode, func(t *testing.T) { noRoomFullStream(t, mode) })
	}
}

func noRoomFullStream(t *testing.T, mode string) {
	ctx := ctxFor(t, 2*time.Minute)
	tp := topology("room", "evt.room")
	b := declared(t, tp)

	js, st := streamOf(ctx, t, tp)
	orig := st.CachedInfo().Config

	roomtest.Run(t, roomtest.Case{
		Broker: b, Topology: tp, Type: "evt.room", Reason: "maximum bytes exceeded", Mode: mode,
		Block: func(t *testing.T) {
			// One message fills the stream to the byte.
			require.NoError(t, b.Publish(ctx, []*broker.Message{{ID: "filler", Type: "evt.room", Body: make([]byte, 512)}}))
			info, err := st.Info(ctx)
			require.NoError(t, err)
			cfg := orig
			cfg.MaxBytes, cfg.Discard = int64(info.State.Bytes), jetstream.DiscardNew
			_, err = js.UpdateStream(ctx, cfg)
			require.NoError(t, err)
		},
		Unblock: func(t *testing.T) {
			// Purge the filler first (the stream keeps its limit a moment
			// longer, so nothing the relay publishes meanwhile is purged).
			require.NoError(t, st.Purge(ctx, jetstream.WithPurgeSequence(2)))
			_, err := js.UpdateStream(ctx, orig)
			require.NoError(t, err)
		},
	})
}
