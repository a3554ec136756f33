package nats_test

import (
	"bufio"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/nats"
	"github.com/ferrymq/ferry/internal/testenv"
)

// TestPublishResendsWhenNoPubAck (issue 19): a publish that gets no
// PubAck, as when the stream leader that received it dies before it
// answers (the client's own connection, on another server, stays up), is
// published again after PublishResend with the same Nats-Msg-Id, instead
// of waiting out PublishTimeout. A loopback proxy between the adapter and
// the server drops one frame: the publish itself (the resend is stored
// once), or the PubAck of a publish the stream stored (the resend is
// confirmed as a duplicate: still one message in the stream). With resends
// off, the same lost publish fails after PublishTimeout.
func TestPublishResendsWhenNoPubAck(t *testing.T) {
	cases := []struct {
		name   string
		resend time.Duration
		drop   func(p *dropProxy, subject string)
		ok     bool
	}{
		{"publish lost", 200 * time.Millisecond, func(p *dropProxy, s string) { p.dropPublish(s) }, true},
		{"PubAck lost", 200 * time.Millisecond, func(p *dropProxy, _ string) { p.dropReply("_INBOX.") }, true},
		{"publish lost, resends off", -1, func(p *dropProxy, s string) { p.dropPublish(s) }, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := ctxFor(t, 60*time.Second)
			p := newDropProxy(t, testenv.HostPort(testenv.NATSURL()))
			u, err := url.Parse(testenv.NATSURL())
			require.NoError(t, err)
			u.Host = p.addr
			b, err := nats.New(ctx, nats.Config{URL: u.String(), PublishResend: c.resend, PublishTimeout: 3 * time.Second})
			require.NoError(t, err)
			t.Cleanup(func() { b.Close() })
			tp := topology("resend", "evt.resend")
			require.NoError(t, b.Declare(ctx, tp))

			c.drop(p, nats.StreamName(tp.Exchange)+".evt.resend")
			err = b.Publish(ctx, []*broker.Message{{ID: "r-1", Type: "evt.resend", Body: []byte("x")}})
			require.True(t, p.dropped(), "the proxy dropped nothing: the test tests nothing")
			if !c.ok {
				var pe *broker.PublishError
				require.ErrorAs(t, err, &pe, "a lost publish without resends waits out PublishTimeout and fails")
				require.Len(t, pe.Failed, 1)
				require.False(t, broker.IsMessageFault(pe.Failed[0].Err), "not the message's fault: %v", pe.Failed[0].Err)
				return
			}
			require.NoError(t, err, "the resend was confirmed")

			nc, err := natsgo.Connect(testenv.NATSURL())
			require.NoError(t, err)
			defer nc.Close()
			js, err := jetstream.New(nc)
			require.NoError(t, err)
			st, err := js.Stream(ctx, nats.StreamName(tp.Exchange))
			require.NoError(t, err)
			info, err := st.Info(ctx)
			require.NoError(t, err)
			require.EqualValues(t, 1, info.State.Msgs, "stored exactly once")
		})
	}
}

// dropProxy forwards NATS client connections to a server and drops one
// frame when armed: the first PUB/HPUB to a subject (client to server) or
// the first MSG/HMSG to a subject with a prefix (server to client).
type dropProxy struct {
	addr string
	mu   sync.Mutex
	pub  string // drop the next publish to this subject
	msg  string // drop the next message whose subject has this prefix
	did  bool
}

func newDropProxy(t *testing.T, target string) *dropProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	p := &dropProxy{addr: ln.Addr().String()}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			t.Cleanup(func() { c.Close(); s.Close() })
			go p.pipe(c, s, true)
			go p.pipe(s, c, false)
		}
	}()
	return p
}

func (p *dropProxy) dropPublish(subject string) { p.mu.Lock(); p.pub = subject; p.mu.Unlock() }
func (p *dropProxy) dropReply(prefix string)    { p.mu.Lock(); p.msg = prefix; p.mu.Unlock() }
func (p *dropProxy) dropped() bool              { p.mu.Lock(); defer p.mu.Unlock(); return p.did }

// pipe copies NATS protocol frames from src to dst; a frame with a
// payload is a control line whose last field is the payload's size,
// followed by the payload and CRLF.
func (p *dropProxy) pipe(src, dst net.Conn, fromClient bool) {
	defer dst.Close()
	r := bufio.NewReader(src)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		f := strings.Fields(line)
		var payload []byte
		if len(f) > 1 {
			switch strings.ToUpper(f[0]) {
			case "PUB", "HPUB", "MSG", "HMSG":
				n, err := strconv.Atoi(f[len(f)-1])
				if err != nil {
					return
				}
				payload = make([]byte, n+2)
				if _, err := io.ReadFull(r, payload); err != nil {
					return
				}
			}
		}
		if p.drop(fromClient, f) {
			continue
		}
		if _, err := dst.Write(append([]byte(line), payload...)); err != nil {
			return
		}
	}
}

func (p *dropProxy) drop(fromClient bool, f []string) bool {
	if len(f) < 2 {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	verb := strings.ToUpper(f[0])
	switch {
	case fromClient && p.pub != "" && (verb == "PUB" || verb == "HPUB") && f[1] == p.pub:
		p.pub, p.did = "", true
		return true
	case !fromClient && p.msg != "" && (verb == "MSG" || verb == "HMSG") && strings.HasPrefix(f[1], p.msg):
		p.msg, p.did = "", true
		return true
	}
	return false
}
