// Package netpart builds a small network of Linux network namespaces for
// partition tests, and cuts it: each node (a cluster's server) runs in a
// namespace of its own whose veth joins a bridge in the host namespace;
// the test's own process (relay, workers, checks) is the node Host, with
// an address on that bridge, so in-process clients reach the nodes
// directly.
//
// Addresses are a /24 of 10.213.0.0/16 that no route or address of the
// host covers; the nodes have no default route, so nothing they send
// leaves the subnet, and the host's own routes and filters are never
// changed. Names carry the test process's pid (namespaces netpart-PID-…,
// links np-PID36-…), so parallel runs do not clash and Sweep removes what
// dead runs left.
//
// Cuts, one-way cuts and loss are nftables rules in a netdev table on
// each node's veth (ingress for what reaches the node, egress for what it
// sends to Host): they drop packets silently, established connections
// included, as a real partition does (the senders time out; nothing
// answers with a reset or an ICMP error). Delay is tc netem on the
// receiving side's link where the kernel has netem. Where it has not (this
// project's test machine), Delay between two nodes is a userspace proxy in
// each node's namespace: nftables redirect the node's new TCP connections
// to the peer to it, it opens the real connection (through the same
// filters, so loss and cuts still apply) and holds every chunk for the
// delay, each way; connections opened before are reset once, so the
// software reconnects through it. It delays TCP only (every broker's
// replication is TCP), by whole chunks rather than packets, and a pair
// with Host needs netem (ErrNoNetem).
//
// It needs root, iproute2 and nft (compose/local/services.sh netns
// installs nftables when missing).
package netpart
