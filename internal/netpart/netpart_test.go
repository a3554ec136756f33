package netpart

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const (
	tcpPort = 7000
	udpPort = 7001
)

// peers is a network with, on every node and on Host's address, a TCP
// echo server and a UDP server counting the datagrams it got per source.
type peers struct {
	t   *testing.T
	net *Net
	mu  sync.Mutex
	got map[string]map[netip.Addr]int // receiving node -> source -> datagrams
}

func setup(t *testing.T, nodes ...string) *peers {
	t.Helper()
	p := &peers{t: t, net: Start(t, nodes...), got: map[string]map[netip.Addr]int{}}
	for _, node := range append(p.net.Nodes(), Host) {
		p.got[node] = map[netip.Addr]int{}
		ip := p.net.IP(node).String()
		var ln net.Listener
		var pc net.PacketConn
		require.NoError(t, p.net.Do(node, func() (err error) {
			if ln, err = net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(tcpPort))); err != nil {
				return err
			}
			pc, err = net.ListenPacket("udp", net.JoinHostPort(ip, strconv.Itoa(udpPort)))
			return err
		}))
		t.Cleanup(func() { ln.Close(); pc.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
			}
		}()
		go func() {
			buf := make([]byte, 64)
			for {
				_, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				p.mu.Lock()
				p.got[node][from.(*net.UDPAddr).AddrPort().Addr()]++
				p.mu.Unlock()
			}
		}()
	}
	return p
}

// dial connects from node from to to's echo server within 1 s and checks
// a byte comes back.
func (p *peers) dial(from, to string) error {
	var conn net.Conn
	err := p.net.Do(from, func() (err error) {
		conn, err = net.DialTimeout("tcp", net.JoinHostPort(p.net.IP(to).String(), strconv.Itoa(tcpPort)), time.Second)
		return err
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	return echo(conn)
}

// open connects from node from to to's echo server and returns the
// connection, closed when the test ends.
func (p *peers) open(from, to string) net.Conn {
	p.t.Helper()
	var conn net.Conn
	require.NoError(p.t, p.net.Do(from, func() (err error) {
		conn, err = net.DialTimeout("tcp", net.JoinHostPort(p.net.IP(to).String(), strconv.Itoa(tcpPort)), time.Second)
		return err
	}))
	p.t.Cleanup(func() { conn.Close() })
	return conn
}

func echo(conn net.Conn) error {
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte{42}); err != nil {
		return err
	}
	b := make([]byte, 1)
	_, err := io.ReadFull(conn, b)
	return err
}

// udp sends n datagrams from node from to to, waits a moment and returns
// how many of them to received.
func (p *peers) udp(from, to string, n int) int {
	p.t.Helper()
	src := p.net.IP(from)
	p.mu.Lock()
	before := p.got[to][src]
	p.mu.Unlock()
	var conn net.Conn
	require.NoError(p.t, p.net.Do(from, func() (err error) {
		conn, err = net.Dial("udp", net.JoinHostPort(p.net.IP(to).String(), strconv.Itoa(udpPort)))
		return err
	}))
	defer conn.Close()
	for i := 0; i < n; i++ {
		_, _ = conn.Write([]byte("x"))
		if i%20 == 19 {
			time.Sleep(time.Millisecond) // keep socket buffers from overflowing
		}
	}
	time.Sleep(300 * time.Millisecond)
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.got[to][src] - before
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// connected asserts that TCP works between every ordered pair but those
// in cut, and fails for those.
func (p *peers) connected(cut ...[2]string) {
	p.t.Helper()
	all := append(p.net.Nodes(), Host)
	for _, a := range all {
		for _, b := range all {
			if a == b {
				continue
			}
			err := p.dial(a, b)
			if isCut(cut, a, b) {
				require.Error(p.t, err, "TCP %s -> %s works across a cut", a, b)
			} else {
				require.NoError(p.t, err, "TCP %s -> %s", a, b)
			}
		}
	}
}

func isCut(cut [][2]string, a, b string) bool {
	for _, c := range cut {
		if c == [2]string{a, b} {
			return true
		}
	}
	return false
}

func TestCutAndHeal(t *testing.T) {
	p := setup(t, "a", "b", "c")
	p.connected()
	// A connection opened before the cut stops carrying data too.
	var conn net.Conn
	require.NoError(t, p.net.Do("a", func() (err error) {
		conn, err = net.Dial("tcp", net.JoinHostPort(p.net.IP("b").String(), strconv.Itoa(tcpPort)))
		return err
	}))
	defer conn.Close()
	require.NoError(t, echo(conn))

	require.NoError(t, p.net.Cut(ctx(t), "a", "b"))
	require.Error(t, echo(conn), "an established connection carries data across a cut")
	p.connected([2]string{"a", "b"}, [2]string{"b", "a"})
	require.Zero(t, p.udp("a", "b", 20))
	require.Zero(t, p.udp("b", "a", 20))

	require.NoError(t, p.net.Heal(ctx(t)))
	p.connected()
	require.Equal(t, 20, p.udp("a", "b", 20))
}

func TestCutOneWay(t *testing.T) {
	p := setup(t, "a", "b")
	require.NoError(t, p.net.CutOneWay(ctx(t), "a", "b"))
	require.Zero(t, p.udp("a", "b", 20), "a's datagrams reach b across a one-way cut a -> b")
	require.Equal(t, 20, p.udp("b", "a", 20), "b's datagrams must still reach a")
	// TCP needs both directions: it fails both ways.
	p.connected([2]string{"a", "b"}, [2]string{"b", "a"})

	// A cut between a node and the test's own side, one way.
	require.NoError(t, p.net.Heal(ctx(t)))
	require.NoError(t, p.net.CutOneWay(ctx(t), "b", Host))
	require.Zero(t, p.udp("b", Host, 20), "b's datagrams reach Host across a one-way cut b -> host")
	require.Equal(t, 20, p.udp(Host, "b", 20))
	require.Equal(t, 20, p.udp("a", "b", 20))
	require.NoError(t, p.net.CutOneWay(ctx(t), Host, "a"))
	require.Zero(t, p.udp(Host, "a", 20))
	require.Equal(t, 20, p.udp("a", Host, 20))

	require.NoError(t, p.net.Heal(ctx(t)))
	p.connected()
}

func TestIsolate(t *testing.T) {
	p := setup(t, "a", "b", "c")
	require.NoError(t, p.net.Isolate(ctx(t), "a"))
	var cut [][2]string
	for _, x := range []string{"b", "c", Host} {
		cut = append(cut, [2]string{"a", x}, [2]string{x, "a"})
	}
	p.connected(cut...)
	require.NoError(t, p.net.Uncut(ctx(t), "a", "b"))
	p.connected(cut[2:]...)
	require.NoError(t, p.net.Heal(ctx(t)))
	p.connected()
}

func TestLoss(t *testing.T) {
	p := setup(t, "a", "b")
	require.NoError(t, p.net.Loss(ctx(t), "a", "b", 100))
	require.Zero(t, p.udp("a", "b", 50))
	require.Zero(t, p.udp("b", "a", 50))
	// Half: with 400 datagrams, none or all arriving is a 2^-400 chance.
	require.NoError(t, p.net.Loss(ctx(t), "a", "b", 50))
	got := p.udp("a", "b", 400)
	t.Logf("50%% loss: %d of 400 datagrams arrived", got)
	require.Greater(t, got, 0)
	require.Less(t, got, 400)
	require.Error(t, p.net.Loss(ctx(t), "a", "b", 101))
	require.NoError(t, p.net.Heal(ctx(t)))
	require.Equal(t, 50, p.udp("a", "b", 50))
}

func TestDelay(t *testing.T) {
	p := setup(t, "a", "b")
	const d = 300 * time.Millisecond
	before := p.open("a", "b") // opened before the delay, kept across it
	require.NoError(t, echo(before))
	require.NoError(t, p.net.Delay(ctx(t), "a", "b", d))
	rtt := func(from, to string) time.Duration {
		start := time.Now()
		require.NoError(t, p.dial(from, to))
		return time.Since(start)
	}
	// An echo crosses the link twice (a connect twice more with netem);
	// each crossing adds d.
	require.GreaterOrEqual(t, rtt("a", "b"), 2*d)
	require.GreaterOrEqual(t, rtt("b", "a"), 2*d)
	var during net.Conn
	if p.net.netem {
		require.NoError(t, p.net.Delay(ctx(t), Host, "a", d))
		require.GreaterOrEqual(t, rtt(Host, "a"), d)
	} else {
		// The userspace delay (this kernel has no netem): Host's pairs are
		// refused, a connection that bypassed the proxy is reset at its
		// next packet, and one made through it is delayed.
		t.Log("no netem in this kernel: the delay is the userspace proxy's")
		require.ErrorIs(t, p.net.Delay(ctx(t), Host, "a", d), ErrNoNetem)
		require.Error(t, echo(before), "a connection opened before the delay is reset")
		during = p.open("a", "b")
		start := time.Now()
		require.NoError(t, echo(during))
		require.GreaterOrEqual(t, time.Since(start), 2*d)
		require.Positive(t, p.net.DelayedConns())
	}
	require.NoError(t, p.net.Heal(ctx(t)))
	require.Less(t, rtt("a", "b"), d, "the delay is gone after Heal")
	require.Less(t, rtt(Host, "a"), d)
	if during != nil {
		start := time.Now()
		require.NoError(t, echo(during), "a proxied connection stays open across Heal")
		require.Less(t, time.Since(start), d, "and is no longer delayed")
	}
	p.connected()
}

func TestFlap(t *testing.T) {
	p := setup(t, "a", "b")
	fctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.net.Flap(fctx, "a", "b", 300*time.Millisecond) }()
	var up, down int
	for fctx.Err() == nil {
		if p.udp("a", "b", 5) == 5 {
			up++
		} else {
			down++
		}
	}
	require.NoError(t, <-done)
	t.Logf("flap: %d samples through, %d cut", up, down)
	require.Positive(t, up)
	require.Positive(t, down)
	p.connected() // healed when Flap returns
}

// owned lists the namespaces and host links whose names carry tag or the
// namespaces of n.
func owned(t *testing.T, n *Net) []string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	require.NoError(t, err)
	links, err := exec.Command("ip", "-o", "link", "show").Output()
	require.NoError(t, err)
	var found []string
	for _, line := range strings.Split(string(out)+string(links), "\n") {
		if strings.Contains(line, nsPrefix+strconv.Itoa(os.Getpid())+"-") && strings.Contains(line, "-"+strings.Split(n.tag, "-")[1]+"-") ||
			strings.Contains(line, linkPrefix+n.tag+"-") {
			found = append(found, line)
		}
	}
	return found
}

func TestClose(t *testing.T) {
	n, err := New(ctx(t), "a", "b")
	require.NoError(t, err)
	require.NotEmpty(t, owned(t, n), "New made no namespace or link that owned can see")
	cmd, err := n.Command(ctx(t), "a", "sleep", "600")
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	require.NoError(t, n.Close())
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		t.Fatal("the process in node a survived Close")
	}
	require.Empty(t, owned(t, n), "left after Close")
	require.NoError(t, n.Close(), "a second Close")
	require.ErrorIs(t, n.Cut(ctx(t), "a", "b"), ErrClosed)
	_, err = n.Command(ctx(t), "a", "true")
	require.ErrorIs(t, err, ErrClosed)
}

func TestSweep(t *testing.T) {
	// A pid that is gone: a process that ran and was waited for.
	dead := exec.Command("true")
	require.NoError(t, dead.Run())
	pid := dead.Process.Pid
	deadNS := fmt.Sprintf("%s%d-1-x", nsPrefix, pid)
	deadLink := fmt.Sprintf("%s%s-1-b", linkPrefix, strconv.FormatInt(int64(pid), 36))
	liveNS := fmt.Sprintf("%s%d-zz-x", nsPrefix, os.Getpid())
	require.NoError(t, run(ctx(t), "ip", "netns", "add", deadNS))
	require.NoError(t, run(ctx(t), "ip", "link", "add", deadLink, "type", "bridge"))
	require.NoError(t, run(ctx(t), "ip", "netns", "add", liveNS))
	t.Cleanup(func() {
		for _, ns := range []string{deadNS, liveNS} {
			_ = removeNamespace(context.Background(), ns)
		}
		if linkExists(deadLink) {
			_ = run(context.Background(), "ip", "link", "del", deadLink)
		}
	})
	require.NoError(t, Sweep(ctx(t)))
	_, err := os.Stat("/run/netns/" + deadNS)
	require.True(t, os.IsNotExist(err), "a dead run's namespace survived Sweep")
	require.False(t, linkExists(deadLink), "a dead run's link survived Sweep")
	_, err = os.Stat("/run/netns/" + liveNS)
	require.NoError(t, err, "Sweep removed a live process's namespace")
}

func TestBadInput(t *testing.T) {
	_, err := New(ctx(t))
	require.Error(t, err)
	_, err = New(ctx(t), "a", "a")
	require.Error(t, err)
	_, err = New(ctx(t), Host)
	require.Error(t, err)
	_, err = New(ctx(t), "Bad-Name")
	require.Error(t, err)
	n := Start(t, "a")
	require.ErrorIs(t, n.Cut(ctx(t), "a", "zz"), ErrUnknownNode)
	_, err = n.Command(ctx(t), "zz", "true")
	require.ErrorIs(t, err, ErrUnknownNode)
	require.Error(t, n.Flap(ctx(t), "a", Host, 0))
}
