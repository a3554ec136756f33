package nats

import (
	"errors"
	"strconv"
	"testing"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
)

func TestAckTrackerSettlesOnlyItsBatch(t *testing.T) {
	tr := newAckTracker()
	wire := make([]natsgo.Msg, 4)
	batch := &pubBatch{errs: make([]error, 4), done: make(chan struct{})}
	batch.errs[1] = &refused{errors.New("bad")} // refused by toWire: not registered
	tr.register(batch, wire, 3)

	boom := errors.New("boom")
	tr.settle(&natsgo.Msg{}, nil) // not ours: ignored
	tr.settle(&wire[1], nil)      // not registered: ignored
	tr.settle(&wire[3], boom)
	tr.settle(&wire[0], nil)
	select {
	case <-batch.done:
		t.Fatal("done before every registered message settled")
	default:
	}
	tr.settle(&wire[2], nil)
	<-batch.done
	tr.settle(&wire[2], boom) // a second report for a settled message: ignored
	require.NoError(t, batch.errs[0])
	require.Error(t, batch.errs[1])
	require.NoError(t, batch.errs[2])
	require.Same(t, boom, batch.errs[3])
	require.Empty(t, tr.pending)
}

func TestAckTrackerAbandon(t *testing.T) {
	tr := newAckTracker()
	wire := make([]natsgo.Msg, 3)
	batch := &pubBatch{errs: make([]error, 3), done: make(chan struct{})}
	tr.register(batch, wire, 3)
	tr.settle(&wire[0], nil)
	tr.abandon(batch, wire)
	tr.settle(&wire[1], nil) // late PubAck after Publish gave up: ignored
	require.NoError(t, batch.errs[0])
	require.Same(t, errNoAck, batch.errs[1])
	require.Same(t, errNoAck, batch.errs[2])
	require.Empty(t, tr.pending)

	empty := &pubBatch{errs: []error{&refused{errors.New("bad")}}, done: make(chan struct{})}
	tr.register(empty, make([]natsgo.Msg, 1), 0)
	<-empty.done // nothing to wait for
}

func TestRouteCache(t *testing.T) {
	d := &declared{exchange: "ex", names: namesFor("ex"), topology: broker.Topology{Exchange: "ex",
		Queues: []broker.Queue{{Name: "q", Bindings: []string{"user.*", "order.#"}}}}}
	for _, typ := range []string{"user.created", "user.created", "order", "order.a.b"} {
		r := d.route(typ)
		require.NoError(t, r.invalid, typ)
		require.False(t, r.unroutable, typ)
		require.Equal(t, "ex."+typ, r.subject)
	}
	require.True(t, d.route("user").unroutable)
	require.True(t, d.route("user.a.b").unroutable)
	require.Error(t, d.route("user.*").invalid)
	require.Error(t, d.route("user..x").invalid)
	require.Same(t, d.route("user.created"), d.route("user.created"), "cached")

	for i := range maxCachedRoutes + 10 {
		typ := "user.t" + strconv.Itoa(i)
		require.False(t, d.route(typ).unroutable)
	}
	require.Len(t, *d.routes.Load(), maxCachedRoutes, "the cache is bounded")
	require.False(t, d.route("user.beyond").unroutable, "a Type past the bound is still decided")
}

// TestEncodeHeadersWireLen checks the one-pass size accounting against
// the header block as NATS frames it.
func TestEncodeHeadersWireLen(t *testing.T) {
	for _, m := range []*broker.Message{
		{ID: "1", Type: "a.b"},
		{ID: "42", Type: "a.b", Key: "user-1", Headers: map[string]string{broker.HeaderCreatedAt: "2026-01-01T00:00:00Z", "traceparent": "00-x"}},
		{ID: " padded ", Type: "a", Key: "k\t", Headers: map[string]string{"h": " v", "g": "w "}},
	} {
		w := encodeHeaders(m, 1)
		require.NoError(t, w.err)
		w.put(jetstream.MsgIDHeader, msgIDWith(m.ID, w.createdAt))
		want := len("NATS/1.0\r\n") + 2
		for k, vs := range w.h {
			for _, v := range vs {
				want += len(k) + 2 + len(v) + 2
			}
		}
		require.Equal(t, want, w.wireLen, "%+v", m)
		require.Equal(t, m.HeaderBytes(), w.userBytes)
		require.Equal(t, m.Headers[broker.HeaderCreatedAt], w.createdAt)
		back := fromWire("ex."+m.Type, "ex.", w.h, nil)
		require.Equal(t, m.ID, back.ID)
		require.Equal(t, m.Key, back.Key)
		require.Equal(t, len(m.Headers), len(back.Headers))
		for k, v := range m.Headers {
			require.Equal(t, v, back.Headers[k])
		}
	}
}

func TestValidHeaderReservedPrefixAnyCase(t *testing.T) {
	for _, k := range []string{"Nats-Msg-Id", "NATS-x", "nAtS-", "Ferry-Id", "FERRY-B64", "ferry-"} {
		require.Error(t, validHeader(k, "v"), k)
	}
	for _, k := range []string{"Nats", "natsx", "ferryman", "x-created-at", "traceparent"} {
		require.NoError(t, validHeader(k, "v"), k)
	}
	require.Error(t, validHeader("é", "v"), "non-ASCII name")
}

// A publish refused for the stream's or the server's state is an outage
// (the relay waits and publishes again); one refused for the message is
// its fault (parked). 10158, "duplicate message id is in process", comes
// back for a resend while the first copy is still being stored after a
// leader change: parking it (as a message fault) charged good rows an
// attempt in the NATS failover test.
func TestAPIOutageCodes(t *testing.T) {
	for _, c := range []struct {
		e      jetstream.APIError
		outage bool
	}{
		{jetstream.APIError{Code: 409, ErrorCode: 10158, Description: "duplicate message id is in process"}, true},
		{jetstream.APIError{Code: 503, ErrorCode: 10077, Description: "maximum messages exceeded"}, true},
		{jetstream.APIError{Code: 500, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, true},
		{jetstream.APIError{Code: 400, ErrorCode: 10060, Description: "expected stream does not match"}, false},
		{jetstream.APIError{Code: 400, ErrorCode: 10071, Description: "wrong last sequence"}, false},
	} {
		require.Equal(t, c.outage, apiOutage(&c.e), "%d %d %s", c.e.Code, c.e.ErrorCode, c.e.Description)
	}
}
