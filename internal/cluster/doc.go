// Package cluster holds ferry's failover tests and what they share with
// ferry bench's failover scenario: Script runs compose/local/services.sh's
// cluster roles (start a cluster, kill, pause or start one node), Nodes
// names a clustered broker's nodes and finds the one that leads a
// topology's work queue, partition or stream (and, on NATS, the work
// queue's consumer, whose leader JetStream places apart from the
// stream's).
//
// The tests run the whole pipeline (outbox.Enqueue, the relay, a worker
// with dedup whose handler's effect is a database row) at a steady rate on
// the clustered servers of compose/local/services.sh (rabbitmq-cluster,
// kafka-cluster, nats-cluster, postgres-ha), while a node is killed
// (SIGKILL), paused beyond the cluster's failure detection (SIGSTOP, then
// SIGCONT) or restarted one after the other.
//
// Each test starts the cluster it needs with services.sh and stops it when
// it ends, so that one cluster runs at a time. Like Jepsen's checkers, a
// test counts: every event carries a sequence number; after the fault the
// test reads back every effect row and fails on a lost event (committed in
// PostgreSQL, no effect), a duplicate effect (two rows for one event), or an
// outbox row parked or charged an attempt; it prints the redeliveries the
// dedup absorbed and the time from the fault to the first event handled
// after it.
//
// SIGSTOP is the nearest thing to a partition that needs no privileges:
// the paused node keeps its sockets open and answers nothing, and the
// others elect a new leader. The partition tests (partition_test.go) cut
// the network itself: each node runs in a network namespace of its own
// (package netpart, root and nftables needed; `services.sh netns`
// installs nftables), and nftables rules there drop the packets between
// the leader and the others while the relay still publishes to it. The
// NATS test starts nats-server there itself; the Kafka and RabbitMQ
// tests start each node with `services.sh run-node ROLE N DIR ADDRS`,
// the configuration of the kafka-cluster and rabbitmq-cluster roles on
// the node's address.
//
// FERRY_CLUSTER_PHASE (a Go duration, default 2s) is how long the load runs
// before and after each fault; `make test-cluster` runs longer phases.
package cluster
