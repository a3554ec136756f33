#!/usr/bin/env bash
# cluster.sh - the clustered servers of ferry's failover tests, on loopback,
# started on demand by compose/local/services.sh (which hands these roles to
# this script; it reuses services.sh's helpers):
#
#   rabbitmq-cluster  3 RabbitMQ nodes of one cluster (own node names, AMQP,
#                     management and distribution ports; one Erlang cookie)
#   kafka-cluster     3 Kafka brokers in KRaft mode, each also a controller;
#                     default.replication.factor=3, min.insync.replicas=2,
#                     unclean.leader.election.enable=false
#   nats-cluster      3 nats-servers with cluster routes and JetStream
#   postgres-ha       a PostgreSQL primary and a synchronous streaming
#                     standby (synchronous_commit=on)
#
#   services.sh up|start|stop|down|reset|status|env ROLE...
#   services.sh node ROLE N kill|pause|resume|stop|start|pid
#                     one node (1..3; postgres-ha: 1 primary, 2 standby):
#                     kill = SIGKILL, pause = SIGSTOP, resume = SIGCONT
#   services.sh run-node ROLE N DIR ADDRS   run one node in the foreground
#                     (for the partition tests, in a namespace; see run_node)
#   services.sh promote postgres-ha   promote the standby (pg_ctl promote)
#                     and clear synchronous_standby_names on it, since
#                     there is no standby left to wait for
#
# Each node has its own data folder under $STATE/cluster/ROLE/nN and its
# own ports (saved as $STATE/ports/cl-ROLE-N-*). Heaps are kept small: the
# three Kafka JVMs take FERRY_KAFKA_CLUSTER_HEAP (default -Xmx384m).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
FERRY_SERVICES_LIB=1
# shellcheck source=services.sh
source "$HERE/services.sh"

CL=$STATE/cluster
ROLES=(rabbitmq-cluster kafka-cluster nats-cluster postgres-ha)
NODES=(1 2 3)

cport() { saved_port "cl-$1-$2-$3"; }          # ROLE N KIND
cchoose() { choose_port "cl-$1-$2-$3" "$4"; } # ROLE N KIND DEFAULT

# cpid PIDFILE MARK: the pid in PIDFILE when alive and its command line or
# environment names MARK (so a reused pid is never taken for ours).
cpid() {
	local pid
	pid=$(pidfile_pid "$1")
	pid_alive "$pid" && { grep -qaF -- "$2" "/proc/$pid/cmdline" 2>/dev/null || grep -qaF -- "$2" "/proc/$pid/environ" 2>/dev/null; } && echo "$pid"
	return 0
}

# wait_for ROLE N CHECK...: wait until CHECK succeeds.
wait_for() {
	local role=$1 n=$2 i
	shift 2
	for i in $(seq $((START_TIMEOUT * 4))); do
		"$@" && return 0
		[ -n "$(node_pid "$role" "$n")" ] || [ "$i" -lt 40 ] || pid_alive "$(pidfile_pid "$CL/$role/n$n/wrapper.pid")" || fail_start "$role node $n" "$(node_log "$role" "$n")" "exited during start"
		sleep 0.25
	done
	fail_start "$role node $n" "$(node_log "$role" "$n")" "not ready after ${START_TIMEOUT}s"
}

# ------------------------------------------------------------ nats-cluster

nats_cl_conf() {
	local n=$1 d=$CL/nats-cluster/n$1 routes="" m
	for m in "${NODES[@]}"; do
		[ "$m" = "$n" ] || routes="$routes    nats-route://127.0.0.1:$(cport nats-cluster "$m" route)"$'\n'
	done
	cat >"$d/nats.conf" <<EOF
# written by compose/local/cluster.sh
server_name: $CHECKOUT-n$n
listen: 127.0.0.1:$(cport nats-cluster "$n" client)
http: 127.0.0.1:$(cport nats-cluster "$n" monitor)
authorization { user: ferry, password: "$CHECKOUT" }
jetstream { store_dir: "$d/js" }
cluster {
  name: $CHECKOUT
  listen: 127.0.0.1:$(cport nats-cluster "$n" route)
  routes: [
$routes  ]
}
EOF
}

nats_cl_ready() {
	local n=$1
	tcp_ok "$(cport nats-cluster "$n" client)" &&
		[ "$(http_status "$(cport nats-cluster "$n" monitor)" '/healthz?js-enabled-only=true')" = 200 ]
}

start_node_nats_cluster() {
	local n=$1 d=$CL/nats-cluster/n$1 bin
	bin=$(go_tool nats-server "$NATS_MODULE" "$NATS_VERSION")
	[ -z "$(node_pid nats-cluster "$n")" ] || return 0
	mkdir -p "$d/js"
	nats_cl_conf "$n"
	say "nats-cluster: starting node $n on 127.0.0.1:$(cport nats-cluster "$n" client)"
	spawn nats-cluster "$d/pid" "$d/log" "$bin" -c "$d/nats.conf"
}

ports_nats_cluster() {
	local n
	for n in "${NODES[@]}"; do
		[ -n "$(node_pid nats-cluster "$n")" ] && continue
		cchoose nats-cluster "$n" client $((4232 + n * 10)) >/dev/null
		cchoose nats-cluster "$n" route $((6232 + n * 10)) >/dev/null
		cchoose nats-cluster "$n" monitor $((8232 + n * 10)) >/dev/null
	done
}

# JetStream needs its meta leader before a stream can be created, and a
# stream of 3 replicas needs all 3 servers in the meta group ("no suitable
# peers for placement", err_code 10005, otherwise): a server joins the meta
# group a moment after its routes are up, so /healthz alone is too early.
# Ready when every node's /jsz counts the whole cluster and names a leader,
# and the leader sees every other peer current.
nats_cl_meta_ready() {
	local n body size=${#NODES[@]} current=0
	for n in "${NODES[@]}"; do
		body=$(http_body "$(cport nats-cluster "$n" monitor)" /jsz) || return 1
		grep -qE "\"cluster_size\": *$size[,}[:space:]]" <<<"$body" || return 1
		grep -qE '"leader": *"[^"]+"' <<<"$body" || return 1
		# Only the leader knows whether its peers are current.
		if grep -qE "\"leader\": *\"[^\"]*-n$n\"" <<<"$body"; then
			current=$(grep -cE '"current": *true' <<<"$body" || true)
		fi
	done
	[ "$current" -ge $((size - 1)) ]
}

ready_nats_cluster() {
	local n
	for n in "${NODES[@]}"; do wait_for nats-cluster "$n" nats_cl_ready "$n"; done
	for _ in $(seq $((START_TIMEOUT * 4))); do
		nats_cl_meta_ready && return 0
		sleep 0.25
	done
	die "nats-cluster: JetStream's meta group has no leader with all ${#NODES[@]} servers after ${START_TIMEOUT}s"
}

env_nats_cluster() {
	local urls="" n
	for n in "${NODES[@]}"; do urls="$urls${urls:+,}nats://ferry:$CHECKOUT@127.0.0.1:$(cport nats-cluster "$n" client)"; done
	echo "export FERRY_NATS_CLUSTER_URL=$urls"
	echo "export FERRY_NATS_CLUSTER_MONITOR=$(for n in "${NODES[@]}"; do printf '%shttp://127.0.0.1:%s' "$([ "$n" = 1 ] || echo ,)" "$(cport nats-cluster "$n" monitor)"; done)"
}

# ------------------------------------------------------------ rabbitmq-cluster

rmq_cl_node() { echo "$CHECKOUT-c$1@localhost"; }

# rmq_cl_env N: the environment of node N's server and of rabbitmqctl
# against it. The Erlang cookie is the user's ($HOME/.erlang.cookie), the
# same for the three nodes and the CLI.
rmq_cl_env() {
	local d=$CL/rabbitmq-cluster/n$1
	export RABBITMQ_NODENAME=$(rmq_cl_node "$1")
	export RABBITMQ_USE_LONGNAME=false
	export RABBITMQ_CONF_ENV_FILE=$d/rabbitmq-env.conf
	export RABBITMQ_CONFIG_FILE=$d/rabbitmq.conf
	export RABBITMQ_ADVANCED_CONFIG_FILE=$d/advanced.config
	export RABBITMQ_ENABLED_PLUGINS_FILE=$d/enabled_plugins
	export RABBITMQ_MNESIA_BASE=$d/mnesia
	export RABBITMQ_LOG_BASE=$d/logdir
	export RABBITMQ_LOGS=$d/log
	export RABBITMQ_PID_FILE=$d/rabbit.pid
	export RABBITMQ_DIST_PORT=$(cport rabbitmq-cluster "$1" dist)
	export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
}

rmq_ctl() { # N ARGS...
	local n=$1
	shift
	(rmq_cl_env "$n" && "$RMQ_BIN/rabbitmqctl" -n "$(rmq_cl_node "$n")" "$@")
}

rmq_cl_ready() {
	local n=$1 body
	tcp_ok "$(cport rabbitmq-cluster "$n" amqp)" &&
		body=$(http_body "$(cport rabbitmq-cluster "$n" http)" /api/overview "$RMQ_AUTH") &&
		grep -qF "\"node\":\"$(rmq_cl_node "$n")\"" <<<"$body"
}

ports_rabbitmq_cluster() {
	local n
	for n in "${NODES[@]}"; do
		[ -n "$(node_pid rabbitmq-cluster "$n")" ] && continue
		cchoose rabbitmq-cluster "$n" amqp $((5672 + n * 10)) >/dev/null
		cchoose rabbitmq-cluster "$n" http $((15672 + n * 10)) >/dev/null
		cchoose rabbitmq-cluster "$n" dist $((25672 + n * 10)) >/dev/null
	done
}

# rmq_cl_conf DIR IP AMQP HTTP [TICK]: write a cluster node's rabbitmq.conf,
# enabled_plugins and rabbitmq-env.conf into DIR (and make its mnesia and
# logdir), AMQP and management listening on IP, net_ticktime TICK seconds
# (default 10). start_node_rabbitmq_cluster
# (loopback) and run-node (a namespace each, for the partition tests)
# share it.
rmq_cl_conf() {
	local d=$1 ip=$2 amqp=$3 http=$4 tick=${5:-10}
	mkdir -p "$d/mnesia" "$d/logdir"
	: >"$d/rabbitmq-env.conf"
	echo '[rabbitmq_management].' >"$d/enabled_plugins"
	cat >"$d/rabbitmq.conf" <<EOF
# written by compose/local/cluster.sh on each start
listeners.tcp.1 = $ip:$amqp
management.tcp.ip = $ip
management.tcp.port = $http
# A node that is cut off from the majority pauses (stops serving clients)
# instead of going on alone: https://www.rabbitmq.com/docs/partitions
cluster_partition_handling = pause_minority
# Failure detection: a node silent for about net_ticktime (to 1.4 times
# it) is down (https://www.rabbitmq.com/docs/nettick); the default 60 s is
# for WANs.
net_ticktime = $tick
EOF
}

start_node_rabbitmq_cluster() {
	local n=$1 d=$CL/rabbitmq-cluster/n$1
	[ -x "$RMQ_BIN/rabbitmq-server" ] || die "rabbitmq-cluster: RabbitMQ is not installed (run: $0 up rabbitmq)"
	[ -z "$(node_pid rabbitmq-cluster "$n")" ] || return 0
	rmq_cl_conf "$d" 127.0.0.1 "$(cport rabbitmq-cluster "$n" amqp)" "$(cport rabbitmq-cluster "$n" http)"
	command -v epmd >/dev/null && bash -c "$CLOSE_FDS"'exec epmd -daemon' </dev/null >/dev/null 2>&1 || true
	say "rabbitmq-cluster: starting node $(rmq_cl_node "$n") on 127.0.0.1:$(cport rabbitmq-cluster "$n" amqp)"
	(rmq_cl_env "$n" && spawn rabbitmq-cluster "$d/wrapper.pid" "$d/out" "$RMQ_BIN/rabbitmq-server")
}

# ready_rabbitmq_cluster: every node up; on the first start nodes 2 and 3
# join node 1 (rabbitmqctl join_cluster), and the user of this checkout is
# added (users are cluster-wide).
ready_rabbitmq_cluster() {
	local n
	for n in "${NODES[@]}"; do wait_for rabbitmq-cluster "$n" rmq_cl_ready "$n"; done
	for n in 2 3; do
		local d=$CL/rabbitmq-cluster/n$n
		[ -f "$d/joined" ] && continue
		say "rabbitmq-cluster: node $n joins $(rmq_cl_node 1)"
		rmq_ctl "$n" -q stop_app >/dev/null
		rmq_ctl "$n" -q join_cluster "$(rmq_cl_node 1)" >/dev/null || die "rabbitmq-cluster: node $n could not join"
		rmq_ctl "$n" -q start_app >/dev/null
		touch "$d/joined"
		wait_for rabbitmq-cluster "$n" rmq_cl_ready "$n"
	done
	if ! rmq_ctl 1 -q authenticate_user "$CHECKOUT" "$CHECKOUT" >/dev/null 2>&1; then
		rmq_ctl 1 -q add_user "$CHECKOUT" "$CHECKOUT" >/dev/null 2>&1 || rmq_ctl 1 -q change_password "$CHECKOUT" "$CHECKOUT" >/dev/null
		rmq_ctl 1 -q set_user_tags "$CHECKOUT" administrator >/dev/null
		rmq_ctl 1 -q set_permissions -p / "$CHECKOUT" '.*' '.*' '.*' >/dev/null
	fi
}

env_rabbitmq_cluster() {
	local urls="" mgmt="" nodes="" n
	for n in "${NODES[@]}"; do
		urls="$urls${urls:+,}amqp://$CHECKOUT:$CHECKOUT@127.0.0.1:$(cport rabbitmq-cluster "$n" amqp)/"
		mgmt="$mgmt${mgmt:+,}http://$CHECKOUT:$CHECKOUT@127.0.0.1:$(cport rabbitmq-cluster "$n" http)"
		nodes="$nodes${nodes:+,}$(rmq_cl_node "$n")"
	done
	echo "export FERRY_RABBITMQ_CLUSTER_URL=$urls"
	echo "export FERRY_RABBITMQ_CLUSTER_MANAGEMENT_URL=$mgmt"
	echo "export FERRY_RABBITMQ_CLUSTER_NODES=$nodes"
}

# ------------------------------------------------------------ kafka-cluster

KAFKA_CLUSTER_HEAP=${FERRY_KAFKA_CLUSTER_HEAP:--Xmx384m -Xms96m}

ports_kafka_cluster() {
	local n
	for n in "${NODES[@]}"; do
		[ -n "$(node_pid kafka-cluster "$n")" ] && continue
		cchoose kafka-cluster "$n" broker $((9192 + n * 10)) >/dev/null
		cchoose kafka-cluster "$n" controller $((9193 + n * 10)) >/dev/null
	done
}

kafka_cl_ready() {
	tcp_ok "$(cport kafka-cluster "$1" broker)" && grep -q 'Kafka Server started' "$CL/kafka-cluster/n$1/current.log" 2>/dev/null
}

# kafka_cl_conf N DIR VOTERS HOST PORT CTLPORT: write broker N's
# server.properties and log4j.properties into DIR (data in DIR/data),
# listening on HOST:PORT (clients, brokers) and HOST:CTLPORT (KRaft);
# VOTERS is controller.quorum.voters. Then format DIR/data once, with the
# cluster id in DIR/../cluster-id (made by the first node that needs it).
# start_node_kafka_cluster (loopback) and run-node (a namespace each, for
# the partition tests) share it.
kafka_cl_conf() {
	local n=$1 d=$2 voters=$3 host=$4 port=$5 ctl=$6 idf
	mkdir -p "$d/data"
	cat >"$d/server.properties" <<EOF
# written by compose/local/cluster.sh on each start
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$voters
listeners=PLAINTEXT://$host:$port,CONTROLLER://$host:$ctl
advertised.listeners=PLAINTEXT://$host:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$d/data
num.partitions=3
# Replicated: an acknowledged write (acks=all) is on 2 of 3 brokers, and an
# out-of-sync replica never becomes leader (https://kafka.apache.org/documentation/#design_ha).
default.replication.factor=3
min.insync.replicas=2
unclean.leader.election.enable=false
offsets.topic.replication.factor=3
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
auto.create.topics.enable=false
group.initial.rebalance.delay.ms=0
# Failure detection: a broker that stops heartbeating is fenced after 6 s.
broker.session.timeout.ms=6000
broker.heartbeat.interval.ms=1000
replica.lag.time.max.ms=6000
num.network.threads=2
num.io.threads=2
num.recovery.threads.per.data.dir=1
num.replica.fetchers=1
EOF
	cp "$KAFKA_DIR/log4j.properties" "$d/log4j.properties" 2>/dev/null || cat >"$d/log4j.properties" <<EOF
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.state.change.logger=WARN
log4j.logger.kafka.log.LogCleaner=WARN
EOF
	if [ ! -f "$d/data/meta.properties" ]; then
		idf=$(dirname "$d")/cluster-id
		if [ ! -s "$idf" ]; then
			# ln fails when another node made it first: one id for all.
			kafka_cluster_id >"$idf.$$"
			ln "$idf.$$" "$idf" 2>/dev/null || true
			rm -f "$idf.$$"
		fi
		java -Dlog4j.configuration="file:$d/log4j.properties" -cp "$KAFKA_LIB/*" kafka.tools.StorageTool format \
			-t "$(cat "$idf")" -c "$d/server.properties" </dev/null >"$d/format.log" 2>&1 ||
			fail_start "kafka-cluster node $n" "$d/format.log" "kafka.tools.StorageTool format failed"
	fi
}

start_node_kafka_cluster() {
	local n=$1 d=$CL/kafka-cluster/n$1 voters="" m
	kafka_jars
	[ -z "$(node_pid kafka-cluster "$n")" ] || return 0
	for m in "${NODES[@]}"; do voters="$voters${voters:+,}$m@127.0.0.1:$(cport kafka-cluster "$m" controller)"; done
	mkdir -p "$CL/kafka-cluster"
	kafka_cl_conf "$n" "$d" "$voters" 127.0.0.1 "$(cport kafka-cluster "$n" broker)" "$(cport kafka-cluster "$n" controller)"
	: >"$d/current.log"
	say "kafka-cluster: starting broker $n on 127.0.0.1:$(cport kafka-cluster "$n" broker)"
	# shellcheck disable=SC2086
	spawn kafka-cluster "$d/pid" "$d/current.log" java $KAFKA_CLUSTER_HEAP -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
		-Djava.awt.headless=true -Dlog4j.configuration="file:$d/log4j.properties" \
		-cp "$KAFKA_LIB/*" kafka.Kafka "$d/server.properties"
}

ready_kafka_cluster() {
	local n
	for n in "${NODES[@]}"; do wait_for kafka-cluster "$n" kafka_cl_ready "$n"; done
}

env_kafka_cluster() {
	local b="" n
	for n in "${NODES[@]}"; do b="$b${b:+,}127.0.0.1:$(cport kafka-cluster "$n" broker)"; done
	echo "export FERRY_KAFKA_CLUSTER_BROKERS=$b"
}

# ------------------------------------------------------------ postgres-ha

# Node 1 starts as the primary, node 2 as its synchronous standby (built
# with pg_basebackup -R); `promote` makes node 2 the primary. A later `up`
# after a promotion keeps whichever runs; `reset postgres-ha` rebuilds the
# pair.
pgha_dir() { echo "$CL/postgres-ha/n$1"; }

pgha_vars() {
	pg_vars || die "postgres-ha: $PG_ERR"
	if is_root; then
		mkdir -p "$CL/postgres-ha"
		chown "$PG_OWNER" "$CL/postgres-ha"
		as_pg test -x "$CL/postgres-ha" || die "postgres-ha: user $PG_OWNER cannot reach $CL (use a FERRY_STATE_DIR it can read)"
	fi
}

pgha_sock() { local s="$(pgha_dir "$1")/run"; [ ${#s} -lt 90 ] && echo "$s" || echo /tmp; }

pgha_psql() { # N ARGS...
	local n=$1
	shift
	as_pg "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$(pgha_sock "$n")" -p "$(cport postgres-ha "$n" port)" -U postgres -d postgres "$@"
}

ports_postgres_ha() {
	local n
	for n in 1 2; do
		[ -n "$(node_pid postgres-ha "$n")" ] && continue
		cchoose postgres-ha "$n" port $((5442 + n)) >/dev/null
	done
}

pgha_ready() { as_pg "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$(cport postgres-ha "$1" port)"; }

start_node_postgres_ha() {
	local n=$1 d
	d=$(pgha_dir "$n")
	pgha_vars
	[ -z "$(node_pid postgres-ha "$n")" ] || return 0
	as_pg mkdir -p "$d" "$(pgha_sock "$n")"
	if [ ! -f "$d/data/PG_VERSION" ]; then
		if [ "$n" = 1 ]; then
			say "postgres-ha: creating the primary in $d/data"
			as_pg "$PGBIN/initdb" -D "$d/data" -U postgres -E UTF8 --locale=C \
				--auth-local=peer --auth-host=scram-sha-256 >"$CL/postgres-ha/init.log" 2>&1 ||
				fail_start postgres-ha "$CL/postgres-ha/init.log" "initdb failed"
			as_pg tee -a "$d/data/postgresql.conf" >/dev/null <<EOF

# ferry (compose/local/cluster.sh): a primary with one synchronous standby.
# A commit returns once the standby has flushed its WAL
# (https://www.postgresql.org/docs/15/warm-standby.html#SYNCHRONOUS-REPLICATION),
# so a promoted standby has every committed outbox row. wal_level = logical
# for the WAL relay (outbox/wal.go; its slot is not replicated, so after a
# promote it creates a new one on the new primary: TestFailoverPostgresWAL).
listen_addresses = '127.0.0.1'
max_connections = 200
shared_buffers = 128MB
wal_level = logical
max_replication_slots = 10
max_wal_senders = 10
wal_keep_size = 256MB
hot_standby = on
synchronous_commit = on
synchronous_standby_names = 'ferry_standby'
EOF
			echo "host replication replicator 127.0.0.1/32 scram-sha-256" | as_pg tee -a "$d/data/pg_hba.conf" >/dev/null
		else
			[ -n "$(node_pid postgres-ha 1)" ] || die "postgres-ha: the standby is built from a running primary"
			say "postgres-ha: building the standby in $d/data (pg_basebackup)"
			as_pg env PGPASSWORD="$CHECKOUT" "$PGBIN/pg_basebackup" -D "$d/data" -R -X stream -c fast \
				-d "host=127.0.0.1 port=$(cport postgres-ha 1 port) user=replicator application_name=ferry_standby" \
				>"$CL/postgres-ha/basebackup.log" 2>&1 || fail_start postgres-ha "$CL/postgres-ha/basebackup.log" "pg_basebackup failed"
		fi
	fi
	say "postgres-ha: starting node $n on 127.0.0.1:$(cport postgres-ha "$n" port)"
	as_pg bash -c "$CLOSE_FDS"'exec "$@"' pg_ctl "$PGBIN/pg_ctl" -D "$d/data" -l "$d/log" -w -t "$START_TIMEOUT" \
		-o "-p $(cport postgres-ha "$n" port) -c unix_socket_directories=$(pgha_sock "$n")" start </dev/null >/dev/null 2>&1 ||
		fail_start postgres-ha "$d/log" "pg_ctl start failed"
	if [ "$n" = 1 ] && [ "$(pgha_psql 1 -tAc 'SELECT pg_is_in_recovery()')" = f ]; then
		# Provision (idempotent): ferry's role and database, and the
		# replication role the standby streams with.
		pgha_psql 1 -c "SET synchronous_commit = local" -c "DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ferry') THEN CREATE ROLE ferry LOGIN CREATEDB PASSWORD '$CHECKOUT'; END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'replicator') THEN CREATE ROLE replicator LOGIN REPLICATION PASSWORD '$CHECKOUT'; END IF;
END \$\$;" -c "ALTER ROLE ferry REPLICATION" -c "ALTER ROLE ferry SET ferry.checkout = '$CHECKOUT'" >/dev/null || die "postgres-ha: could not create roles"
		if [ "$(pgha_psql 1 -tAc "SELECT 1 FROM pg_database WHERE datname = 'ferry'")" != 1 ]; then
			pgha_psql 1 -c "SET synchronous_commit = local" -c "CREATE DATABASE ferry OWNER ferry" >/dev/null || die "postgres-ha: could not create database ferry"
		fi
	fi
}

ready_postgres_ha() {
	local n
	for n in 1 2; do
		[ -n "$(node_pid postgres-ha "$n")" ] || continue
		wait_for postgres-ha "$n" pgha_ready "$n"
	done
}

promote_postgres_ha() {
	pgha_vars
	local n=2
	[ "$(pgha_psql 1 -tAc 'SELECT pg_is_in_recovery()' 2>/dev/null)" = t ] && n=1
	say "postgres-ha: promoting node $n"
	as_pg "$PGBIN/pg_ctl" -D "$(pgha_dir "$n")/data" -w -t 60 promote >/dev/null || die "postgres-ha: pg_ctl promote failed"
	pgha_psql "$n" -c "ALTER SYSTEM SET synchronous_standby_names = ''" -c "SELECT pg_reload_conf()" >/dev/null
}

env_postgres_ha() {
	echo "export FERRY_DATABASE_HA_URL=postgres://ferry:$CHECKOUT@127.0.0.1:$(cport postgres-ha 1 port),127.0.0.1:$(cport postgres-ha 2 port)/ferry?target_session_attrs=read-write"
}

# ------------------------------------------------------------ nodes

fn() { echo "${1//-/_}"; } # role name as a function suffix

nodes_of() { if [ "$1" = postgres-ha ]; then echo 1 2; else echo "${NODES[@]}"; fi; }

node_pid() { # ROLE N
	local d=$CL/$1/n$2
	case $1 in
	nats-cluster) cpid "$d/pid" "$d/nats.conf" ;;
	kafka-cluster) cpid "$d/pid" "$d/server.properties" ;;
	rabbitmq-cluster) cpid "$d/rabbit.pid" "RABBITMQ_MNESIA_BASE=$d/mnesia" ;;
	postgres-ha) cpid "$d/data/postmaster.pid" "$d/data" ;;
	esac
}

node_log() { # ROLE N
	local d=$CL/$1/n$2
	case $1 in
	kafka-cluster) echo "$d/current.log" ;;
	*) echo "$d/log" ;;
	esac
}

start_role() {
	local role=$1 n
	mkdir -p "$CL/$role"
	if [ "$role" = postgres-ha ]; then
		pgha_vars
		if as_pg test -f "$(pgha_dir 2)/data/PG_VERSION" && ! as_pg test -f "$(pgha_dir 2)/data/standby.signal"; then
			die "postgres-ha: the standby (node 2) was promoted; node 1's data has diverged from it. Run '$HERE/services.sh reset postgres-ha' to build the pair again"
		fi
	fi
	"ports_$(fn "$role")"
	for n in $(nodes_of "$role"); do "start_node_$(fn "$role")" "$n"; done
	"ready_$(fn "$role")"
	say "$role: ready"
}

stop_node() { # ROLE N
	local pid
	pid=$(node_pid "$1" "$2")
	[ -n "$pid" ] || return 0
	kill -CONT "$pid" 2>/dev/null || true
	if [ "$1" = postgres-ha ]; then
		pgha_vars
		as_pg "$PGBIN/pg_ctl" -D "$(pgha_dir "$2")/data" -m fast -w -t 60 stop >/dev/null 2>&1 && return 0
	fi
	stop_if_running "$1 node $2" "$pid"
	[ "$1" != rabbitmq-cluster ] || stop_pid "$1" "$(pidfile_pid "$CL/$1/n$2/wrapper.pid")"
}

stop_role() {
	local n
	for n in $(nodes_of "$1" | tr ' ' '\n' | sort -r); do stop_node "$1" "$n"; done
}

status_role() {
	local n pid
	for n in $(nodes_of "$1"); do
		pid=$(node_pid "$1" "$n")
		printf '%-16s node %s  %s\n' "$1" "$n" "$([ -n "$pid" ] && echo "running pid $pid" || echo stopped)  ports $(for f in "$STATE"/ports/cl-"$1"-"$n"-*; do [ -f "$f" ] && printf '%s=%s ' "${f##*-}" "$(cat "$f")"; done)"
	done
}

# run_node ROLE N DIR ADDRS: run node N (1..3) of ROLE in the foreground
# (exec: the caller's process becomes the server) with its data and
# configuration in DIR, listening on the Nth address of ADDRS (a comma
# list of the nodes' IPv4 addresses, in node order) on the role's default
# ports. For the partition tests (internal/cluster), which start each node
# in a network namespace of its own (so the ports need not differ); no
# state of `up` is used or changed.
run_node() {
	local role=${1:-} n=${2:-} d=${3:-} addrs=${4:-} ips m voters=""
	[ -n "$n" ] && [ -n "$d" ] && [ -n "$addrs" ] || die "run-node: want ROLE N DIR ADDRS"
	IFS=, read -r -a ips <<<"$addrs"
	[ "$n" -ge 1 ] && [ "$n" -le ${#ips[@]} ] || die "run-node: node $n of ${#ips[@]} addresses"
	local ip=${ips[$((n - 1))]}
	mkdir -p "$d"
	case $role in
	kafka-cluster)
		kafka_jars
		for m in "${!ips[@]}"; do voters="$voters${voters:+,}$((m + 1))@${ips[$m]}:9093"; done
		kafka_cl_conf "$n" "$d" "$voters" "$ip" 9092 9093
		# shellcheck disable=SC2086
		exec java $KAFKA_CLUSTER_HEAP -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
			-Djava.awt.headless=true -Dlog4j.configuration="file:$d/log4j.properties" \
			-cp "$KAFKA_LIB/*" kafka.Kafka "$d/server.properties"
		;;
	rabbitmq-cluster)
		# Node names rabbit@IP (long names), one epmd per namespace (erl
		# starts it), distribution on 25672 of the node's address. The
		# nodes form the cluster by themselves, booting at once
		# (classic_config peer discovery, which takes a global lock, so
		# that one node forms the cluster and the others join it). The user
		# ferry (password ferry, administrator) is made on the first boot.
		# net_ticktime is 4 s, not 10: a cut node is found down (and, with
		# pause_minority, pauses) within 4-6 s, so that a test's cut need
		# not last 16 s.
		local peers="" dist=${ip//./,}
		for m in "${!ips[@]}"; do peers="${peers}cluster_formation.classic_config.nodes.$((m + 1)) = rabbit@${ips[$m]}"$'\n'; done
		rmq_cl_conf "$d" "$ip" 5672 15672 4
		cat >>"$d/rabbitmq.conf" <<EOF
cluster_formation.peer_discovery_backend = classic_config
$peers
default_user = ferry
default_pass = ferry
default_user_tags.administrator = true
default_permissions.configure = .*
default_permissions.read = .*
default_permissions.write = .*
EOF
		export RABBITMQ_NODENAME=rabbit@$ip RABBITMQ_USE_LONGNAME=true
		export RABBITMQ_CONF_ENV_FILE=$d/rabbitmq-env.conf RABBITMQ_CONFIG_FILE=$d/rabbitmq.conf
		export RABBITMQ_ADVANCED_CONFIG_FILE=$d/advanced.config RABBITMQ_ENABLED_PLUGINS_FILE=$d/enabled_plugins
		export RABBITMQ_MNESIA_BASE=$d/mnesia RABBITMQ_LOG_BASE=$d/logdir RABBITMQ_LOGS=- RABBITMQ_PID_FILE=$d/rabbit.pid
		export RABBITMQ_DIST_PORT=25672
		# No busy-waiting schedulers: three VMs share a small machine.
		export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {$dist} +sbwt none +sbwtdcpu none +sbwtdio none"
		exec "$RMQ_BIN/rabbitmq-server"
		;;
	*) die "run-node: no role '$role' (kafka-cluster, rabbitmq-cluster)" ;;
	esac
}

cluster_main() {
	local cmd=$1
	shift
	case $cmd in
	node)
		local role=${1:-} n=${2:-} what=${3:-} pid
		case " ${ROLES[*]} " in *" $role "*) ;; *) die "node: unknown role '$role' (known: ${ROLES[*]})" ;; esac
		case " $(nodes_of "$role") " in *" $n "*) ;; *) die "node: $role has nodes $(nodes_of "$role")" ;; esac
		pid=$(node_pid "$role" "$n")
		case $what in
		pid) echo "$pid" ;;
		kill) [ -z "$pid" ] || kill -KILL "$pid" ;;
		pause) [ -n "$pid" ] && kill -STOP "$pid" ;;
		resume) [ -n "$pid" ] && kill -CONT "$pid" ;;
		stop) lock && stop_node "$role" "$n" ;;
		start)
			lock
			# The node's ports stay those `env` printed.
			[ -z "$pid" ] || { kill -CONT "$pid"; return 0; }
			"start_node_$(fn "$role")" "$n"
			# Ready when this node serves (the cluster's other nodes are
			# not waited for: they may be down on purpose).
			case $role in
			postgres-ha) wait_for "$role" "$n" pgha_ready "$n" ;;
			nats-cluster) wait_for "$role" "$n" nats_cl_ready "$n" ;;
			kafka-cluster) wait_for "$role" "$n" kafka_cl_ready "$n" ;;
			rabbitmq-cluster) wait_for "$role" "$n" rmq_cl_ready "$n" ;;
			esac
			;;
		*) die "node: want kill, pause, resume, stop, start or pid" ;;
		esac
		return 0
		;;
	run-node)
		run_node "$@"
		;;
	promote)
		[ "${1:-}" = postgres-ha ] || die "promote: only postgres-ha"
		lock
		promote_postgres_ha
		return 0
		;;
	esac
	local role
	for role in "$@"; do
		case " ${ROLES[*]} " in *" $role "*) ;; *) die "unknown cluster role '$role' (known: ${ROLES[*]})" ;; esac
	done
	case $cmd in
	up | start)
		lock
		ensure_packages $(for r in "$@"; do case $r in rabbitmq-cluster) echo rabbitmq ;; kafka-cluster) echo kafka ;; postgres-ha) echo postgres ;; esac; done)
		for role in "$@"; do start_role "$role"; done
		;;
	restart)
		lock
		for role in "$@"; do stop_role "$role"; done
		for role in "$@"; do start_role "$role"; done
		;;
	stop)
		lock
		for role in "$@"; do stop_role "$role"; done
		;;
	down)
		lock
		for role in "$@"; do stop_role "$role" && rm -f "$STATE"/ports/cl-"$role"-*; done
		;;
	reset)
		lock
		for role in "$@"; do stop_role "$role" && rm -rf "${CL:?}/$role" "$STATE"/ports/cl-"$role"-*; done
		;;
	status) for role in "$@"; do status_role "$role"; done ;;
	env)
		for role in "$@"; do
			if [ -n "$(node_pid "$role" 1)$(node_pid "$role" 2)" ]; then "env_$(fn "$role")"; else echo "# $role is not running (start it: $HERE/services.sh up $role)"; fi
		done
		;;
	*) usage ;;
	esac
}

cluster_main "$@"
