package netpart

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// proxyMark is the SO_MARK of a delay proxy's own connections to the
// delayed peer: neither the redirect to the proxy nor the reset of flows
// that bypass it applies to them.
const proxyMark = 0x6e70

// proxyChunk is the most a delay proxy reads at once (bytes); proxyQueue
// the chunks it holds per direction before it stops reading (so a
// direction holds at most proxyQueue × proxyChunk bytes in flight).
const (
	proxyChunk = 32 << 10
	proxyQueue = 512
)

// hasNetem reports whether the kernel has the netem queueing discipline:
// it adds one to ns's loopback and removes it again.
func hasNetem(ctx context.Context, ns string) (bool, error) {
	out, err := exec.CommandContext(ctx, "tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms").CombinedOutput()
	if err != nil {
		if s := string(out); strings.Contains(s, "qdisc kind is unknown") || strings.Contains(s, "Unknown qdisc") {
			return false, nil
		}
		return false, fmt.Errorf("netpart: probing for netem: tc: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return true, run(ctx, "tc", "-n", ns, "qdisc", "del", "dev", "lo", "root")
}

// delayProxy is the userspace delay of one node, used where the kernel has
// no netem: nftables in the node's namespace redirect every new TCP
// connection the node opens to a delayed peer to this proxy (on the
// node's loopback), which opens the real connection to the peer (marked
// proxyMark, so from the node's own address, through the same filters as
// any other packet: cuts and loss still apply to it) and copies both
// directions, holding each chunk for the pair's delay from the moment it
// was read. A connection that existed before the delay bypasses the proxy;
// its next packet from this node is answered with a TCP reset, so the
// node's software reconnects (through the proxy). The delays are looked up
// per chunk: a Heal makes the proxied connections immediate at once, and
// they stay open; the pair's later connections still pass the proxy, with
// no delay. UDP is not delayed.
type delayProxy struct {
	n    *Net
	node string
	ln   net.Listener
	port int

	delays atomic.Pointer[map[netip.Addr]time.Duration] // peer -> delay
	routed map[netip.Addr]bool                          // peers redirected here (under Net.mu)

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// startProxy listens on 127.0.0.1 in node's namespace and serves there
// until close.
func (n *Net) startProxy(node string) (*delayProxy, error) {
	p := &delayProxy{n: n, node: node, conns: map[net.Conn]struct{}{}, routed: map[netip.Addr]bool{}}
	p.delays.Store(&map[netip.Addr]time.Duration{})
	err := n.Do(node, func() (err error) {
		p.ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netpart: delay proxy of %s: %w", node, err)
	}
	p.port = p.ln.Addr().(*net.TCPAddr).Port
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Netem reports whether the kernel has netem, so that Delay is tc netem
// on the links; false: Delay is the userspace proxy (delayProxy).
func (n *Net) Netem() bool { return n.netem }

// DelayedConns is the number of TCP connections the userspace delay has
// carried since New (its proxies connected them to their peer); always 0
// where Delay is netem.
func (n *Net) DelayedConns() int64 { return n.delayedConns.Load() }

func (p *delayProxy) delay(peer netip.Addr) time.Duration { return (*p.delays.Load())[peer] }

// track adds c to the open connections; false when the proxy is closed
// (c is closed then).
func (p *delayProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *delayProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		c.Close()
		delete(p.conns, c)
	}
}

func (p *delayProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go p.handle(c.(*net.TCPConn))
	}
}

// handle connects c's original destination and pipes the two.
func (p *delayProxy) handle(c *net.TCPConn) {
	defer p.wg.Done()
	dst, err := originalDst(c)
	if err != nil {
		p.untrack(c)
		return
	}
	var up net.Conn
	err = p.n.Do(p.node, func() (err error) {
		d := net.Dialer{Timeout: 10 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, proxyMark) }); err != nil {
				return err
			}
			return serr
		}}
		up, err = d.Dial("tcp", dst.String())
		return err
	})
	if err != nil || !p.track(up) {
		p.untrack(c) // the peer is unreachable: the client sees its connection closed
		return
	}
	p.n.delayedConns.Add(1)
	peer := dst.Addr()
	done := make(chan struct{}, 2)
	go func() { p.pipe(up.(*net.TCPConn), c, peer); done <- struct{}{} }()
	go func() { p.pipe(c, up.(*net.TCPConn), peer); done <- struct{}{} }()
	<-done
	<-done
	p.untrack(c, up)
}

// pipe copies src to dst, each chunk written the pair's delay after it
// was read, in order. At src's end it half-closes dst; on an error either
// way it closes both, so the other direction ends too.
func (p *delayProxy) pipe(dst, src *net.TCPConn, peer netip.Addr) {
	type chunk struct {
		b   []byte
		due time.Time
	}
	ch := make(chan chunk, proxyQueue)
	stop := make(chan struct{})
	var rerr error
	go func() {
		defer close(ch)
		for {
			buf := make([]byte, proxyChunk)
			k, err := src.Read(buf)
			if k > 0 {
				select {
				case ch <- chunk{buf[:k], time.Now().Add(p.delay(peer))}:
				case <-stop:
					return
				}
			}
			if err != nil {
				rerr = err
				return
			}
		}
	}()
	for c := range ch {
		if w := time.Until(c.due); w > 0 {
			time.Sleep(w)
		}
		if _, err := dst.Write(c.b); err != nil {
			close(stop)
			src.Close()
			dst.Close()
			for range ch {
			}
			return
		}
	}
	if errors.Is(rerr, io.EOF) {
		_ = dst.CloseWrite()
		return
	}
	src.Close()
	dst.Close()
}

// close stops the proxy and closes its connections.
func (p *delayProxy) close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

// originalDst is where c's client connected before the redirect
// (SO_ORIGINAL_DST, a sockaddr_in; linux/netfilter_ipv4.h).
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var sa *unix.IPv6Mreq // 16 bytes, the size of a sockaddr_in
	var serr error
	if err := rc.Control(func(fd uintptr) { sa, serr = unix.GetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IP, unix.SO_ORIGINAL_DST) }); err != nil {
		return netip.AddrPort{}, err
	}
	if serr != nil {
		return netip.AddrPort{}, fmt.Errorf("netpart: SO_ORIGINAL_DST: %w", serr)
	}
	b := sa.Multiaddr
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), binary.BigEndian.Uint16(b[2:4])), nil
}

// renderProxyDelay writes node's redirect to its delay proxy for the
// peers it has a delay with (starting the proxy on first use) and gives
// the proxy those delays. Delays with Host need netem: the redirect would
// be in the host's namespace, which this package never changes.
func (n *Net) renderProxyDelay(ctx context.Context, node string) error {
	peers := map[netip.Addr]time.Duration{}
	for r, d := range n.delay {
		if r.From != node && r.To != node {
			continue
		}
		if r.From == Host || r.To == Host {
			return fmt.Errorf("%w: a delay to or from %s needs netem (the userspace delay works between nodes)", ErrNoNetem, Host)
		}
		if r.From == node {
			peers[n.ip[r.To]] = d
		}
	}
	p := n.proxy[node]
	if p == nil && len(peers) == 0 {
		return nil
	}
	if p == nil {
		var err error
		if p, err = n.startProxy(node); err != nil {
			return err
		}
		n.proxy[node] = p
	}
	// The redirect of a peer stays once made, with no delay after a Heal:
	// removing it would break the connections it redirected (their NAT
	// binding goes with it, seen as resets in TestDelay).
	for a := range peers {
		p.routed[a] = true
	}
	var b strings.Builder
	b.WriteString(`table ip netpartdelay {
	chain toproxy { type nat hook output priority -100; policy accept; }
	chain stale { type filter hook output priority 0; policy accept; }
}
flush chain ip netpartdelay toproxy
flush chain ip netpartdelay stale
`)
	for _, a := range slices.SortedFunc(maps.Keys(p.routed), netip.Addr.Compare) {
		fmt.Fprintf(&b, "add rule ip netpartdelay toproxy meta mark != %#x ip daddr %s meta l4proto tcp redirect to :%d\n", proxyMark, a, p.port)
		// A flow this node opened before the redirect (conntrack keeps it
		// un-NATed) is reset at its next packet; resets themselves pass, so
		// that the peer's answer to a stale packet reaches this node too.
		fmt.Fprintf(&b, "add rule ip netpartdelay stale meta mark != %#x ip daddr %s ct direction original ct status != dnat tcp flags & rst == 0 reject with tcp reset\n", proxyMark, a)
	}
	if err := n.nft(ctx, node, b.String()); err != nil {
		return err
	}
	p.delays.Store(&peers)
	return nil
}
