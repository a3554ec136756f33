package netpart

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Host is the name of the test's own side of the network: the host
// namespace, attached to the bridge with an address of its own. A test's
// in-process relay and workers connect from there; Cut, CutOneWay, Loss
// and Delay take it like any node.
const Host = "host"

var (
	// ErrUnknownNode is wrapped by the error of an operation naming a node
	// the network does not have.
	ErrUnknownNode = errors.New("netpart: unknown node")
	// ErrNoNetem is wrapped by Delay's error for a pair with Host when the kernel has no netem
	// queueing discipline (CONFIG_NET_SCH_NETEM), so no delay can be added.
	ErrNoNetem = errors.New("netpart: the kernel has no netem (CONFIG_NET_SCH_NETEM)")
	// ErrClosed is returned by operations on a closed network.
	ErrClosed = errors.New("netpart: network closed")
)

// nsPrefix starts every namespace this package makes; linkPrefix every
// link (bridge, host-side veth ends) it makes in the host namespace. Both
// are followed by the making process's pid, which is how Sweep tells the
// leftovers of dead runs.
const (
	nsPrefix   = "netpart-"
	linkPrefix = "np-"
	nodeDev    = "eth0" // a node's veth end, inside its namespace
)

// nameRE is what a node name may be: it is part of a namespace name.
var nameRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,11}$`)

var seq atomic.Int64

// rule is one direction of traffic a rule acts on: packets from From to
// To.
type rule struct{ From, To string }

// Net is one test's network: a bridge in the host namespace holding the
// address of Host, and one namespace per node, each with a veth to the
// bridge and an address in a /24 of 10.213.0.0/16 that no host route
// covers. Nodes have no default route: their traffic cannot leave the
// subnet. Its methods may be called concurrently.
type Net struct {
	tag    string // pid and sequence, in every name
	bridge string
	prefix netip.Prefix
	nodes  []string          // node names, in order
	ns     map[string]string // node -> namespace name
	hostIf map[string]string // node -> its veth end in the host namespace
	ip     map[string]netip.Addr

	mu     sync.Mutex
	closed bool
	drop   map[rule]bool // cut directions
	loss   map[rule]int  // percent
	delay  map[rule]time.Duration
	tcOn   map[string]bool // "ns/dev" holding a root qdisc of ours
	cmds   []*exec.Cmd
	netem  bool                   // the kernel has netem (probed by New)
	proxy  map[string]*delayProxy // node -> its delay proxy, without netem

	delayedConns atomic.Int64 // connections the delay proxies carried
}

// New makes a network of the named nodes (lower-case letters and digits,
// starting with a letter, at most 12, at most 9 nodes, not "host"). It
// first sweeps the leftovers of dead runs (Sweep). It needs root, ip and
// nft; on error, what it made is removed again. Close removes it.
func New(ctx context.Context, nodes ...string) (*Net, error) {
	if len(nodes) == 0 || len(nodes) > 9 {
		return nil, fmt.Errorf("netpart: %d nodes (1 to 9)", len(nodes))
	}
	for i, n := range nodes {
		if !nameRE.MatchString(n) || n == Host || slices.Index(nodes, n) != i {
			return nil, fmt.Errorf("netpart: node name %q: want a unique [a-z][a-z0-9]{0,11}, not %q", n, Host)
		}
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("netpart: %s not found (compose/local/services.sh netns installs it): %w", tool, err)
		}
	}
	if err := Sweep(ctx); err != nil {
		return nil, err
	}
	k := seq.Add(1)
	tag := strconv.FormatInt(int64(os.Getpid()), 36) + "-" + strconv.FormatInt(k, 36)
	prefix, err := freeSubnet(ctx, int(int64(os.Getpid())*7+k))
	if err != nil {
		return nil, err
	}
	n := &Net{
		tag: tag, bridge: linkPrefix + tag + "-b", prefix: prefix, nodes: slices.Clone(nodes),
		ns: map[string]string{}, hostIf: map[string]string{}, ip: map[string]netip.Addr{},
		drop: map[rule]bool{}, loss: map[rule]int{}, delay: map[rule]time.Duration{}, tcOn: map[string]bool{}, proxy: map[string]*delayProxy{},
	}
	base := prefix.Addr().As4()
	n.ip[Host] = netip.AddrFrom4([4]byte{base[0], base[1], base[2], 1})
	for i, node := range nodes {
		n.ns[node] = fmt.Sprintf("%s%d-%s-%s", nsPrefix, os.Getpid(), strconv.FormatInt(k, 36), node)
		n.hostIf[node] = fmt.Sprintf("%s%s-%d", linkPrefix, tag, i+1)
		n.ip[node] = netip.AddrFrom4([4]byte{base[0], base[1], base[2], byte(11 + i)})
	}
	if err := n.build(ctx); err != nil {
		return nil, errors.Join(err, n.Close())
	}
	return n, nil
}

// Start is New for a test: it fails t on error and closes the network
// when the test ends (t.Cleanup), failing t if anything is left.
func Start(t testing.TB, nodes ...string) *Net {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := New(ctx, nodes...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Error(err)
		}
	})
	return n
}

func (n *Net) build(ctx context.Context) error {
	hostPfx := netip.PrefixFrom(n.ip[Host], 24).String()
	if err := run(ctx, "ip", "link", "add", n.bridge, "type", "bridge"); err != nil {
		return err
	}
	// No IPv6 on our links: no router solicitations or DAD chatter.
	_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+n.bridge+"/disable_ipv6", []byte("1"), 0o644)
	if err := batch(ctx, "",
		"addr add "+hostPfx+" dev "+n.bridge,
		"link set "+n.bridge+" up"); err != nil {
		return err
	}
	for _, node := range n.nodes {
		ns, hif := n.ns[node], n.hostIf[node]
		if err := run(ctx, "ip", "netns", "add", ns); err != nil {
			return err
		}
		if err := run(ctx, "ip", "link", "add", hif, "type", "veth", "peer", "name", nodeDev, "netns", ns); err != nil {
			return err
		}
		_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+hif+"/disable_ipv6", []byte("1"), 0o644)
		if err := batch(ctx, "",
			"link set "+hif+" master "+n.bridge,
			"link set "+hif+" up"); err != nil {
			return err
		}
		if err := run(ctx, "ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"); err != nil {
			return err
		}
		if err := batch(ctx, ns,
			"link set lo up",
			"addr add "+netip.PrefixFrom(n.ip[node], 24).String()+" dev "+nodeDev,
			"link set "+nodeDev+" up"); err != nil {
			return err
		}
		// The node's filter: a netdev table on its veth, ingress for what
		// reaches it, egress for what it sends to Host. Netdev hooks see
		// every packet (no conntrack shortcut for established flows) and a
		// drop at the receiver's ingress is silent for the sender.
		if err := n.nft(ctx, node, `table netdev netpart {
	chain in { type filter hook ingress device "`+nodeDev+`" priority 0; policy accept; }
	chain out { type filter hook egress device "`+nodeDev+`" priority 0; policy accept; }
}`); err != nil {
			return err
		}
	}
	var err error
	n.netem, err = hasNetem(ctx, n.ns[n.nodes[0]])
	return err
}

// Nodes returns the node names, in the order New got them.
func (n *Net) Nodes() []string { return slices.Clone(n.nodes) }

// IP returns node's address (Host's too); the zero Addr for an unknown
// node.
func (n *Net) IP(node string) netip.Addr { return n.ip[node] }

// Namespace returns node's network namespace name (for `ip netns exec`);
// "" for Host and unknown nodes.
func (n *Net) Namespace(node string) string { return n.ns[node] }

// Subnet returns the network's /24.
func (n *Net) Subnet() netip.Prefix { return n.prefix }

func (n *Net) known(nodes ...string) error {
	for _, x := range nodes {
		if _, ok := n.ip[x]; !ok {
			return fmt.Errorf("%w: %q (have %s, %s)", ErrUnknownNode, x, strings.Join(n.nodes, ", "), Host)
		}
	}
	return nil
}

// Command returns a command that runs name with args inside node's
// namespace (`ip netns exec`; for Host, directly), killed when ctx ends.
// Close kills it when it still runs. The caller starts it.
func (n *Net) Command(ctx context.Context, node, name string, args ...string) (*exec.Cmd, error) {
	if err := n.known(node); err != nil {
		return nil, err
	}
	var cmd *exec.Cmd
	if node == Host {
		cmd = exec.CommandContext(ctx, name, args...)
	} else {
		// ip netns exec execs the command: the pid is the command's own.
		cmd = exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.ns[node], name}, args...)...)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, ErrClosed
	}
	n.cmds = append(n.cmds, cmd)
	return cmd, nil
}

// Do runs fn on an OS thread switched into node's namespace (Host: the
// calling thread's own): the sockets fn creates (net.Listen, net.Dial)
// belong to that namespace for their whole life. Goroutines fn starts run
// elsewhere. It returns fn's error, or why the switch failed.
func (n *Net) Do(node string, fn func() error) error {
	if err := n.known(node); err != nil {
		return err
	}
	if node == Host {
		return fn()
	}
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netpart: %w", err)
	}
	defer orig.Close()
	target, err := os.Open("/run/netns/" + n.ns[node])
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netpart: node %s: %w", node, err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netpart: setns %s: %w", n.ns[node], err)
	}
	ferr := fn()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays locked, so it dies with this goroutine instead of
		// running others in the wrong namespace.
		return errors.Join(ferr, fmt.Errorf("netpart: setns back: %w", err))
	}
	runtime.UnlockOSThread()
	return ferr
}

// Cut drops all traffic between a and b, both ways, until Uncut or Heal.
func (n *Net) Cut(ctx context.Context, a, b string) error {
	return n.change(ctx, func() { n.drop[rule{a, b}], n.drop[rule{b, a}] = true, true }, a, b)
}

// CutOneWay drops the packets from sends to to, and only those: to's
// packets still reach from (a TCP connection between them fails either
// way, since it needs both directions; UDP shows the direction).
func (n *Net) CutOneWay(ctx context.Context, from, to string) error {
	return n.change(ctx, func() { n.drop[rule{from, to}] = true }, from, to)
}

// Uncut removes the cuts between a and b (both directions), leaving the
// others.
func (n *Net) Uncut(ctx context.Context, a, b string) error {
	return n.change(ctx, func() { delete(n.drop, rule{a, b}); delete(n.drop, rule{b, a}) }, a, b)
}

// Isolate cuts node from every other node and from Host.
func (n *Net) Isolate(ctx context.Context, node string) error {
	return n.change(ctx, func() {
		for x := range n.ip {
			if x != node {
				n.drop[rule{node, x}], n.drop[rule{x, node}] = true, true
			}
		}
	}, node)
}

// Loss drops percent (0 to 100) of the packets between a and b, each
// way, at random.
func (n *Net) Loss(ctx context.Context, a, b string, percent int) error {
	if percent < 0 || percent > 100 {
		return fmt.Errorf("netpart: loss %d%%: want 0 to 100", percent)
	}
	return n.change(ctx, func() { n.loss[rule{a, b}], n.loss[rule{b, a}] = percent, percent }, a, b)
}

// Delay adds d to every packet between a and b, each way (tc netem on the
// receiving node's bridge port; a Host-bound direction on the bridge
// itself). On a kernel without netem it delays TCP between two nodes in
// userspace (delayProxy: each node's new connections to the other pass a
// proxy in its namespace that holds every chunk for d each way; the
// connections open before are reset once, so their software reconnects
// through it; UDP is not delayed), and returns an error wrapping
// ErrNoNetem for a pair with Host.
func (n *Net) Delay(ctx context.Context, a, b string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("netpart: delay %v: want > 0", d)
	}
	return n.change(ctx, func() { n.delay[rule{a, b}], n.delay[rule{b, a}] = d, d }, a, b)
}

// Heal removes every cut, loss and delay.
func (n *Net) Heal(ctx context.Context) error {
	return n.change(ctx, func() {
		clear(n.drop)
		clear(n.loss)
		clear(n.delay)
	}, n.nodes...)
}

// Flap cuts a from b and heals that cut, every period, until ctx ends;
// it leaves the pair healed and returns nil then, or the first error.
func (n *Net) Flap(ctx context.Context, a, b string, period time.Duration) error {
	if period <= 0 {
		return fmt.Errorf("netpart: flap period %v: want > 0", period)
	}
	bg := context.WithoutCancel(ctx)
	for {
		if err := n.Cut(bg, a, b); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return n.Uncut(bg, a, b)
		case <-time.After(period):
		}
		if err := n.Uncut(bg, a, b); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(period):
		}
	}
}

// change applies edit to the wanted state and renders it again on every
// node (their filters are small: a full render keeps them exact). When
// that fails, the state before edit is restored and rendered again, so
// that a change that could not be applied does not linger.
func (n *Net) change(ctx context.Context, edit func(), nodes ...string) error {
	if err := n.known(nodes...); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	drop, loss, delay := maps.Clone(n.drop), maps.Clone(n.loss), maps.Clone(n.delay)
	edit()
	err := n.render(ctx)
	if err != nil {
		n.drop, n.loss, n.delay = drop, loss, delay
		if rerr := n.render(ctx); rerr != nil {
			err = errors.Join(err, fmt.Errorf("netpart: restoring the state before the failed change: %w", rerr))
		}
	}
	return err
}

func (n *Net) render(ctx context.Context) error {
	var errs []error
	for _, node := range n.nodes {
		errs = append(errs, n.renderFilter(ctx, node), n.renderDelay(ctx, node))
	}
	return errors.Join(errs...)
}

// renderFilter writes node's chains from the wanted state: a direction
// into a node is dropped at its ingress, a direction from a node to Host
// at its egress (nothing is ever added to the host namespace's filters).
func (n *Net) renderFilter(ctx context.Context, node string) error {
	var b strings.Builder
	b.WriteString("flush chain netdev netpart in\nflush chain netdev netpart out\n")
	add := func(r rule, match string) {
		if r.To == node {
			fmt.Fprintf(&b, "add rule netdev netpart in ip saddr %s %s\n", n.ip[r.From], match)
		} else if r.From == node && r.To == Host {
			fmt.Fprintf(&b, "add rule netdev netpart out ip daddr %s %s\n", n.ip[Host], match)
		}
	}
	for _, r := range sortedRules(n.drop) {
		add(r, "drop")
	}
	for _, r := range sortedRules(n.loss) {
		switch p := n.loss[r]; p {
		case 0:
		case 100:
			add(r, "drop")
		default:
			add(r, fmt.Sprintf("numgen random mod 100 < %d drop", p))
		}
	}
	return n.nft(ctx, node, b.String())
}

// renderDelay writes the delays of node's directions: what node
// receives leaves its bridge port (the host-side veth end), matched on the
// source; what node sends to Host leaves its own veth end, matched on
// Host's address. Each is an htb root whose default class passes traffic
// untouched, with a class and a netem child per delayed peer.
func (n *Net) renderDelay(ctx context.Context, node string) error {
	in := map[netip.Addr]time.Duration{}
	out := map[netip.Addr]time.Duration{}
	for r, d := range n.delay {
		if r.To == node {
			in[n.ip[r.From]] = d
		} else if r.From == node && r.To == Host {
			out[n.ip[Host]] = d
		}
	}
	if !n.netem {
		return n.renderProxyDelay(ctx, node)
	}
	return errors.Join(
		n.tcDelay(ctx, "", n.hostIf[node], in, "src"),
		n.tcDelay(ctx, n.ns[node], nodeDev, out, "dst"))
}

// tcDelay makes dev's (in namespace ns, "" for the host's) root qdisc
// delay the packets whose ip field (src or dst) is a key of delays, by
// its value; with no delays it removes the root qdisc it added before.
func (n *Net) tcDelay(ctx context.Context, ns, dev string, delays map[netip.Addr]time.Duration, field string) error {
	tc := func(args ...string) error {
		if ns != "" {
			args = append([]string{"-n", ns}, args...)
		}
		return run(ctx, "tc", args...)
	}
	key := ns + "/" + dev
	if n.tcOn[key] {
		if err := tc("qdisc", "del", "dev", dev, "root"); err != nil {
			return err
		}
		delete(n.tcOn, key)
	}
	if len(delays) == 0 {
		return nil
	}
	if err := tc("qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1"); err != nil {
		return err
	}
	n.tcOn[key] = true
	if err := tc("class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", "10gbit"); err != nil {
		return err
	}
	addrs := make([]netip.Addr, 0, len(delays))
	for a := range delays {
		addrs = append(addrs, a)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	for i, a := range addrs {
		class := fmt.Sprintf("1:%d", 10+i)
		if err := tc("class", "add", "dev", dev, "parent", "1:", "classid", class, "htb", "rate", "10gbit"); err != nil {
			return err
		}
		us := strconv.FormatInt(delays[a].Microseconds(), 10) + "us"
		if err := tc("qdisc", "add", "dev", dev, "parent", class, "netem", "delay", us); err != nil {
			return err
		}
		if err := tc("filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "u32", "match", "ip", field, a.String()+"/32", "flowid", class); err != nil {
			return err
		}
	}
	return nil
}

func sortedRules[V any](m map[rule]V) []rule {
	rs := make([]rule, 0, len(m))
	for r := range m {
		rs = append(rs, r)
	}
	sort.Slice(rs, func(i, j int) bool {
		if rs[i].From != rs[j].From {
			return rs[i].From < rs[j].From
		}
		return rs[i].To < rs[j].To
	})
	return rs
}

// nft runs an nft script inside node's namespace.
func (n *Net) nft(ctx context.Context, node, script string) error {
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", n.ns[node], "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("netpart: nft in %s: %w: %s\n%s", n.ns[node], err, bytes.TrimSpace(out), script)
	}
	return nil
}

// Close kills the processes Command made that still run and any other
// process left in the nodes' namespaces, then deletes the namespaces (and
// with them the veth pairs) and the bridge. It returns what it could not
// remove; it may be called again.
func (n *Net) Close() error {
	n.mu.Lock()
	n.closed = true
	cmds := n.cmds
	n.cmds = nil
	proxies := n.proxy
	n.proxy = map[string]*delayProxy{}
	n.mu.Unlock()
	for _, p := range proxies {
		p.close()
	}
	for _, c := range cmds {
		if c.Process != nil && c.ProcessState == nil {
			_ = c.Process.Kill()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	for _, node := range n.nodes {
		errs = append(errs, removeNamespace(ctx, n.ns[node]))
	}
	if linkExists(n.bridge) {
		errs = append(errs, run(ctx, "ip", "link", "del", n.bridge))
	}
	for _, node := range n.nodes {
		errs = append(errs, delLink(ctx, n.hostIf[node]))
	}
	return errors.Join(errs...)
}

// delLink deletes a host-side veth end left after its namespace is gone.
// The kernel removes both ends of a pair when the namespace holding one
// goes, but does so asynchronously after `ip netns del` returns: the link
// is given a moment to vanish by itself, and a "Cannot find device" from
// a delete that raced that removal is success, not an error.
func delLink(ctx context.Context, name string) error {
	for i := 0; i < 20 && linkExists(name); i++ {
		time.Sleep(50 * time.Millisecond)
	}
	if !linkExists(name) {
		return nil
	}
	err := run(ctx, "ip", "link", "del", name)
	if err != nil && !linkExists(name) {
		return nil
	}
	return err
}

// removeNamespace kills what runs in ns (only processes of a namespace
// this package made), then deletes it.
func removeNamespace(ctx context.Context, ns string) error {
	if _, err := os.Stat("/run/netns/" + ns); err != nil {
		return nil
	}
	for i := 0; i < 50; i++ {
		out, err := exec.CommandContext(ctx, "ip", "netns", "pids", ns).Output()
		if err != nil || len(bytes.TrimSpace(out)) == 0 {
			break
		}
		for _, f := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(f); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return run(ctx, "ip", "netns", "del", ns)
}

func linkExists(name string) bool {
	_, err := os.Stat("/sys/class/net/" + name)
	return err == nil
}

// Sweep removes the namespaces and links that runs of this package left
// behind when their process is gone (a crashed or killed test): names
// carry the pid of the process that made them. It never touches a live
// process's network.
func Sweep(ctx context.Context) error {
	var errs []error
	if ents, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range ents {
			if pid, ok := pidOf(e.Name(), nsPrefix, 10); ok && !alive(pid) {
				errs = append(errs, removeNamespace(ctx, e.Name()))
			}
		}
	}
	if ents, err := os.ReadDir("/sys/class/net"); err == nil {
		for _, e := range ents {
			if pid, ok := pidOf(e.Name(), linkPrefix, 36); ok && !alive(pid) && linkExists(e.Name()) {
				errs = append(errs, delLink(ctx, e.Name()))
			}
		}
	}
	return errors.Join(errs...)
}

// pidOf reads the pid after prefix in name (up to the next '-').
func pidOf(name, prefix string, base int) (int, bool) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return 0, false
	}
	p, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	pid, err := strconv.ParseInt(p, base, 64)
	return int(pid), err == nil && pid > 0
}

func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// freeSubnet picks a /24 of 10.213.0.0/16, starting at one derived from
// hint, that overlaps no route of the host namespace (the default route
// aside) and no address of its links: so no traffic of the test can
// reach, or be taken for, a real network.
func freeSubnet(ctx context.Context, hint int) (netip.Prefix, error) {
	out, err := exec.CommandContext(ctx, "ip", "-4", "-o", "route", "show", "table", "all").Output()
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("netpart: ip route: %w", err)
	}
	addrs, err := exec.CommandContext(ctx, "ip", "-4", "-o", "addr", "show").Output()
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("netpart: ip addr: %w", err)
	}
	var used []netip.Prefix
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		dst := f[0]
		if dst == "local" || dst == "broadcast" || dst == "unicast" || dst == "blackhole" || dst == "unreachable" || dst == "prohibit" {
			if len(f) < 2 {
				continue
			}
			dst = f[1]
		}
		if dst == "default" {
			continue
		}
		if !strings.Contains(dst, "/") {
			dst += "/32"
		}
		if p, err := netip.ParsePrefix(dst); err == nil {
			used = append(used, p)
		}
	}
	for _, line := range strings.Split(string(addrs), "\n") {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "inet" {
				if p, err := netip.ParsePrefix(f[i+1]); err == nil {
					used = append(used, p.Masked())
				}
			}
		}
	}
	for i := 0; i < 254; i++ {
		c := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 213, byte(1 + (hint+i)%254), 0}), 24)
		if !slices.ContainsFunc(used, c.Overlaps) {
			return c, nil
		}
	}
	return netip.Prefix{}, errors.New("netpart: no free /24 in 10.213.0.0/16")
}

// run runs a command and returns an error with its output when it fails.
func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("netpart: %s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// batch runs ip commands (one per line, without "ip"), in ns when it is
// not "".
func batch(ctx context.Context, ns string, cmds ...string) error {
	args := []string{}
	if ns != "" {
		args = append(args, "-n", ns)
	}
	cmd := exec.CommandContext(ctx, "ip", append(args, "-batch", "-")...)
	cmd.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("netpart: ip %s: %w: %s", strings.Join(cmds, "; "), err, bytes.TrimSpace(out))
	}
	return nil
}
