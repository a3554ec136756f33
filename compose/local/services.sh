#!/usr/bin/env bash
# services.sh - run the servers ferry's CLI and tests talk to, on loopback,
# without Docker: PostgreSQL, RabbitMQ (+ management), Mailpit (SMTP + HTTP
# API), nats-server with JetStream, Apache Kafka (KRaft, one JVM),
# ElasticMQ (an SQS-compatible server on Java 17) and moto's standalone
# server (a second SQS implementation, Python, in memory).
#
#   compose/local/services.sh up     [NAME...]  install what is missing, start, provision
#   compose/local/services.sh down   [NAME...]  stop and forget the chosen ports
#   compose/local/services.sh stop   [NAME...]  stop, keep data and ports (outage tests)
#   compose/local/services.sh start  [NAME...]  start again (same ports), wait until ready
#   compose/local/services.sh restart [NAME...]
#   compose/local/services.sh status [NAME...]  what runs where
#   compose/local/services.sh env    [NAME...]  export FERRY_...=... lines for eval
#   compose/local/services.sh reset  [NAME...]  stop and delete data, logs and ports
#   compose/local/services.sh rabbitmqctl ARGS  rabbitmqctl against our node
#   compose/local/services.sh node ROLE N kill|pause|resume|stop|start|pid
#   compose/local/services.sh promote postgres-ha
#   compose/local/services.sh run-node kafka-cluster|rabbitmq-cluster N DIR ADDRS
#                     run node N of a cluster role in the foreground, its
#                     data in DIR, on the Nth address of ADDRS (for the
#                     partition tests, one network namespace per node)
#   compose/local/services.sh netns   install what the partition tests
#                     (internal/netpart) need: nftables; print the tools'
#                     paths as export lines (FERRY_NFT, FERRY_NATS_SERVER)
#
# NAME is one of: postgres rabbitmq smtp nats kafka sqs moto (none = all).
# The cluster roles rabbitmq-cluster kafka-cluster nats-cluster postgres-ha
# are started only when named (one role per call is best on a small
# machine); cluster.sh runs them and describes them.
#
# State (data, logs, pid files, chosen ports) lives in compose/local/.state/
# (git-ignored; override with FERRY_STATE_DIR); `reset` deletes it, to start
# from scratch. Every command is idempotent. When a default port is
# taken by a program that is not ours, another free port is chosen and
# `env` reports it; a server that loses a newly chosen port to another
# program before binding it is started again on the next free one.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STATE=${FERRY_STATE_DIR:-$HERE/.state}
ALL=(postgres rabbitmq smtp nats kafka sqs moto)

NATS_MODULE=github.com/nats-io/nats-server/v2
NATS_VERSION=v2.15.2
MAILPIT_MODULE=github.com/axllent/mailpit
MAILPIT_VERSION=v1.33.1
KAFKA_VERSION=4.1.1
KAFKA_SCALA=2.13
SLF4J_VERSION=1.7.36
ELASTICMQ_ARTIFACT=org.elasticmq:elasticmq-server_2.13
ELASTICMQ_VERSION=1.6.11
ELASTICMQ_XMX=${FERRY_ELASTICMQ_XMX:-256m}
# h2 (default): queues and messages kept on disk across a real stop;
# memory: nothing kept, and about a third of the CPU per message (bench/
# README.md, "SQS scaling"). Read when ElasticMQ starts.
ELASTICMQ_STORE=${FERRY_ELASTICMQ_STORE:-h2}
MOTO_VERSION=5.1.22

# Default ports: the CLI's defaults.
DEF_PG=5432
DEF_AMQP=5672
DEF_RMQ_HTTP=15672
DEF_RMQ_DIST=25672
DEF_SMTP=1025
DEF_SMTP_HTTP=8025
DEF_NATS=4222
DEF_NATS_HTTP=8222
DEF_KAFKA=9092
DEF_KAFKA_CONTROLLER=9093
DEF_SQS=9324
DEF_MOTO=9325

RMQ_BIN=/usr/lib/rabbitmq/bin
START_TIMEOUT=${FERRY_SERVICES_TIMEOUT:-180} # seconds to wait for a server to be ready

export HOME=${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}
export LC_ALL=C.UTF-8 LANG=C.UTF-8 2>/dev/null || true

say() { printf 'services: %s\n' "$*" >&2; }

# checkout_id: a name unique to this state folder (so to this checkout).
# It names the RabbitMQ node and the NATS server, and makes the password of
# every server this checkout runs (PostgreSQL, RabbitMQ, NATS), so that the
# tests and commands of one checkout are refused by another checkout's
# server when that server took a port this one freed (`stop`), instead of
# silently talking to it. `env` prints the credentials and the names the
# tests check (internal/testenv).
checkout_id() { echo "ferry-$(printf '%s' "$STATE" | cksum | cut -d' ' -f1)"; }
CHECKOUT=$(checkout_id)
die() {
	printf 'services: error: %s\n' "$*" >&2
	exit 1
}
is_root() { [ "$(id -u)" = 0 ]; }

usage() {
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
}

# ---------------------------------------------------------------- ports

# port_listening PORT: true if any socket LISTENs on PORT (any address).
port_listening() {
	local hex files=()
	hex=$(printf '%04X' "$1")
	for f in /proc/net/tcp /proc/net/tcp6; do [ -r "$f" ] && files+=("$f"); done
	if [ ${#files[@]} -gt 0 ]; then
		awk -v p=":$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { found = 1 } END { exit !found }' "${files[@]}"
		return
	fi
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# tcp_ok PORT: true if 127.0.0.1:PORT accepts a connection.
tcp_ok() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# http_status PORT PATH [BASIC_AUTH_B64]: prints the HTTP status code of GET.
http_status() {
	(
		exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
		auth=""
		[ -n "${3:-}" ] && auth="Authorization: Basic $3"$'\r\n'
		printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1:%s\r\n%sConnection: close\r\n\r\n' "$2" "$1" "$auth" >&3
		IFS=' ' read -r -t 10 _ code _ <&3 || exit 1
		printf '%s\n' "$code"
	) 2>/dev/null
}

saved_port() { cat "$STATE/ports/$1" 2>/dev/null || true; }

# choose_port KEY DEFAULT: the saved port of KEY if free, else DEFAULT if
# free, else the next free one; saved under $STATE/ports/KEY.
# wait_ready NAME WHAT: wait until NAME_ready succeeds, failing with NAME's
# log if its process (WHAT) exits or START_TIMEOUT passes.
wait_ready() {
	local name=$1 what=$2 i gone=0
	for i in $(seq $((START_TIMEOUT * 4))); do
		"${name}_ready" && { say "$name: ready"; return 0; }
		# Gone on two looks in a row: while spawn's shell execs the server,
		# /proc/PID/cmdline can read empty for an instant, and one look
		# then misses a process that is starting.
		if [ -n "$("${name}_pid")" ]; then
			gone=0
		else
			gone=$((gone + 1))
			[ "$gone" -lt 2 ] || fail_start "$name" "$STATE/$name.log" "$what exited during start"
		fi
		sleep 0.25
	done
	fail_start "$name" "$STATE/$name.log" "not ready after ${START_TIMEOUT}s"
}

# stop_if_running NAME PID: stop NAME's process PID, if there is one.
stop_if_running() {
	[ -n "$2" ] || return 0
	say "$1: stopping"
	stop_pid "$1" "$2"
}

service_of_key() { case $1 in rabbitmq*) echo rabbitmq ;; smtp*) echo smtp ;; nats*) echo nats ;; kafka*) echo kafka ;; sqs*) echo sqs ;; *) echo "$1" ;; esac; }

choose_port() {
	local key=$1 def=$2 p saved others
	mkdir -p "$STATE/ports"
	saved=$(saved_port "$key")
	# A saved port is an address already handed out (to tests through
	# `env`): moving it silently would point them at another program.
	if [ -n "$saved" ] && port_listening "$saved"; then
		die "$key: its port $saved is now taken by another program; free it, or run '$0 down $(service_of_key "$key")' to forget the port and pick another"
	fi
	others=$(for f in "$STATE"/ports/*; do [ -f "$f" ] && [ "$(basename "$f")" != "$key" ] && cat "$f"; done 2>/dev/null || true)
	for p in $saved $def $(seq $((def + 1)) $((def + 200))); do
		if grep -qx "$p" <<<"$others"; then continue; fi
		case " $LOST_PORTS " in *" $p "*) continue ;; esac
		if ! port_listening "$p"; then
			if [ "$p" != "$def" ] && [ "$p" != "$saved" ]; then
				say "$key: port $def is taken by another program; using $p"
			fi
			echo "$p" >"$STATE/ports/$key"
			echo "$p"
			return 0
		fi
	done
	die "$key: no free port near $def"
}

# The choice and the bind are two steps: choose_port finds a port free,
# and the server binds it a moment later. Another program (a second
# checkout's services.sh) can take the port in between, and the server
# then dies with "address already in use". start_service retries that
# start on the next free ports, so the server comes up all the same.

# LOST_PORTS are ports a server of this run failed to bind; choose_port
# skips them (a socket bound without listening is not seen by
# port_listening).
LOST_PORTS=""
BIND_RETRIES=5
declare -A LOG_SIZE=()

# keys_of NAME: the port keys of NAME that are saved now.
keys_of() {
	local f
	for f in "$STATE"/ports/*; do
		[ -f "$f" ] || continue
		[ "$(service_of_key "${f##*/}")" = "$1" ] && echo "${f##*/}"
	done
	return 0
}

# logs_of NAME: the files where NAME's server writes why it stopped.
logs_of() {
	case $1 in
	postgres) pg_vars 2>/dev/null && echo "$PGLOG" ;;
	rabbitmq) echo "$RMQ_LOG" "$STATE/rabbitmq.out" ;;
	kafka) echo "$KAFKA_DIR/current.log" ;;
	*) echo "$STATE/$1.log" ;;
	esac
	return 0
}

# lost_bind NAME: true if NAME's logs say, since LOG_SIZE was taken, that
# an address was in use (PostgreSQL, Go and Java: "Address already in use";
# Erlang: eaddrinuse).
lost_bind() {
	local log size
	for log in $(logs_of "$1"); do
		[ -f "$log" ] || continue
		size=${LOG_SIZE[$log]:-0}
		[ "$(stat -c %s "$log")" -ge "$size" ] || size=0 # truncated at start (kafka)
		tail -c +$((size + 1)) "$log" | grep -qiE 'address already in use|eaddrinuse' && return 0
	done
	return 1
}

# start_service NAME: start_NAME, again on the next free ports (at most
# BIND_RETRIES times) when the server lost the bind of a port this start
# chose. A port saved by an earlier start is never moved (tests may have
# it through `env`): losing it fails, as choose_port does.
start_service() {
	local name=$1 try rc saved fresh k log
	for try in $(seq "$BIND_RETRIES"); do
		saved=" $(keys_of "$name" | tr '\n' ' ') "
		for log in $(logs_of "$name"); do LOG_SIZE[$log]=$(stat -c %s "$log" 2>/dev/null || echo 0); done
		set +e
		(
			set -e
			"start_$name"
		)
		rc=$?
		set -e
		[ "$rc" != 0 ] || return 0
		lost_bind "$name" || exit "$rc"
		fresh=""
		for k in $(keys_of "$name"); do
			case $saved in *" $k "*) ;; *) fresh="$fresh $k" ;; esac
		done
		[ -n "$fresh" ] || die "$name: lost the bind of a port it had before ($(for k in $(keys_of "$name"); do printf '%s=%s ' "$k" "$(saved_port "$k")"; done)); free it, or run '$0 down $name' to pick another"
		if running "$name"; then (SQS_REAL_STOP=1 "stop_$name"); fi
		for k in $fresh; do
			LOST_PORTS="$LOST_PORTS $(saved_port "$k")"
			rm -f "$STATE/ports/$k"
		done
		say "$name: another program took a port between its choice and the bind (attempt $try of $BIND_RETRIES); starting again on the next free ports"
	done
	die "$name: lost the bind of its ports $BIND_RETRIES times (ports$LOST_PORTS)"
}

# ------------------------------------------------------------ processes

pid_alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }
pidfile_pid() { head -n1 "$1" 2>/dev/null | tr -dc 0-9 || true; }

# CLOSE_FDS, at the start of a `bash -c` script, closes every descriptor
# above 2 it inherited (our lock, a caller's pipes): a server must not keep
# them open for its whole life.
CLOSE_FDS='for fd in /proc/$$/fd/*; do fd=${fd##*/}; [ "$fd" -gt 2 ] 2>/dev/null && eval "exec $fd>&-"; done 2>/dev/null; '

# spawn NAME PIDFILE LOG CMD...: start CMD detached (own session, stdin
# from /dev/null, output to LOG) and record its pid. It never holds the
# caller's stdout, so `go test` calling us does not hang.
spawn() {
	local pidfile=$2 log=$3
	shift 3
	rm -f "$pidfile"
	setsid bash -c "$CLOSE_FDS"'echo $$ >"$0"; exec "$@"' "$pidfile" "$@" </dev/null >>"$log" 2>&1 &
	for _ in $(seq 50); do [ -s "$pidfile" ] && return 0; sleep 0.1; done
	die "could not start $*"
}

# stop_pid NAME PID: SIGTERM, wait (graceful), SIGKILL after 60 s.
stop_pid() {
	local name=$1 pid=$2 i
	pid_alive "$pid" || return 0
	kill -TERM "$pid" 2>/dev/null || true
	for i in $(seq 600); do
		pid_alive "$pid" || return 0
		sleep 0.1
	done
	say "$name: did not stop in 60 s; killing pid $pid"
	kill -KILL "$pid" 2>/dev/null || true
	sleep 0.5
}

fail_start() {
	local name=$1 log=$2
	shift 2
	printf 'services: error: %s: %s\n' "$name" "$*" >&2
	if [ -f "$log" ]; then
		printf 'services: last lines of %s:\n' "$log" >&2
		tail -n 30 "$log" | sed 's/^/    /' >&2
	fi
	exit 1
}

# ------------------------------------------------------------ installing

APT_UPDATED=""
apt_install() {
	local sudo=""
	if ! is_root; then
		command -v sudo >/dev/null || die "need root (or sudo) to install: $*"
		sudo=sudo
	fi
	command -v apt-get >/dev/null || die "apt-get not found; install these yourself: $*"
	say "installing Debian packages: $*"
	# Keep the packages' init scripts from starting the system-wide
	# servers: we run our own on loopback.
	local policy=/usr/sbin/policy-rc.d added=""
	if [ ! -e "$policy" ]; then
		printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
		$sudo chmod 755 "$policy"
		added=1
	fi
	local rc=0
	{
		if [ -z "$APT_UPDATED" ]; then
			$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q && APT_UPDATED=1
		fi &&
			$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"
	} </dev/null >&2 || rc=$?
	[ -n "$added" ] && $sudo rm -f "$policy"
	[ "$rc" = 0 ] || die "apt-get install $* failed (exit $rc)"
}

pg_bindir() {
	local d
	for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
		[ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && { echo "$d"; return 0; }
	done
	return 1
}

# ensure_packages NAME...: one apt-get run for everything missing.
ensure_packages() {
	local pkgs=() n
	for n in "$@"; do
		case $n in
		postgres) pg_bindir >/dev/null || pkgs+=(postgresql) ;;
		rabbitmq) [ -x "$RMQ_BIN/rabbitmq-server" ] || pkgs+=(rabbitmq-server) ;;
		kafka | sqs)
			java_ok || pkgs+=(openjdk-17-jre-headless)
			command -v mvn >/dev/null || pkgs+=(maven)
			;;
		moto) python3 -c 'import venv, ensurepip' 2>/dev/null || pkgs+=(python3-venv) ;;
		netns) command -v nft >/dev/null || pkgs+=(nftables) ;;
		esac
	done
	[ ${#pkgs[@]} -eq 0 ] || apt_install "${pkgs[@]}"
}

go_cmd() {
	if command -v go >/dev/null; then
		command -v go
	elif [ -x /usr/local/go/bin/go ]; then
		echo /usr/local/go/bin/go
	else
		return 1
	fi
}

# go_tool NAME MODULE VERSION: path of NAME built from MODULE@VERSION with
# `go install`, kept per version outside the work tree (shared by clones)
# and linked into $STATE/bin.
go_tool() {
	local name=$1 module=$2 version=$3 go gopath dir bin
	go=$(go_cmd) || die "$name: Go is needed to install $module@$version"
	gopath=$("$go" env GOPATH)
	dir="${gopath%%:*}/ferry-tools/$name@$version"
	bin="$dir/$name"
	if [ ! -x "$bin" ]; then
		say "$name: go install $module@$version (first time only)"
		mkdir -p "$dir"
		(cd / && GOBIN="$dir" GOFLAGS=-buildvcs=false "$go" install "$module@$version") </dev/null >&2 ||
			die "$name: go install $module@$version failed"
		[ -x "$bin" ] || die "$name: go install did not produce $bin"
	fi
	mkdir -p "$STATE/bin"
	ln -sfn "$bin" "$STATE/bin/$name"
	echo "$bin"
}

# ------------------------------------------------------------ postgres

PG_OWNER=""
PG_ERR=""

# as_pg CMD...: run CMD as the cluster's owner, from /.
as_pg() {
	if is_root; then
		(cd / && runuser -u "$PG_OWNER" -- "$@")
	else
		(cd / && "$@")
	fi
}

# pg_home: the private cluster's folder. $STATE/postgres when the postgres
# user can reach it, else a folder under its home (with a link in $STATE).
pg_home() {
	if ! is_root || as_pg test -x "$STATE" 2>/dev/null; then
		echo "$STATE/postgres"
		return
	fi
	local h
	h=$(getent passwd postgres | cut -d: -f6)
	echo "$h/ferry-$(printf '%s' "$STATE" | cksum | cut -d' ' -f1)"
}

# pg_vars: sets PGBIN PG_OWNER PGHOME PGDATA_DIR PGLOG PGSOCK; returns 1
# with PG_ERR set when PostgreSQL is not installed.
pg_vars() {
	PGBIN=$(pg_bindir) || { PG_ERR="PostgreSQL is not installed (run: $0 up postgres)"; return 1; }
	if is_root; then
		id postgres >/dev/null 2>&1 || { PG_ERR="the 'postgres' system user is missing (reinstall the postgresql package)"; return 1; }
		PG_OWNER=postgres
	else
		PG_OWNER=$(id -un)
	fi
	PGHOME=$(pg_home)
	PGDATA_DIR=$PGHOME/data
	PGLOG=$PGHOME/postgres.log
	if [ ${#PGHOME} -lt 80 ]; then PGSOCK=$PGHOME/run; else PGSOCK=/tmp; fi
}

pg_pid() {
	local pid
	pid=$(pidfile_pid "$PGDATA_DIR/postmaster.pid")
	pid_alive "$pid" && grep -qaF -- "$PGDATA_DIR" "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
	return 0
}

# PG_WAL_OPTS are the server settings of the WAL relay: logical decoding,
# and slots and senders for the tests' relays (each test has its own slot).
PG_WAL_OPTS="-c wal_level=logical -c max_replication_slots=64 -c max_wal_senders=64"

pg_port() { sed -n 4p "$PGDATA_DIR/postmaster.pid" 2>/dev/null || saved_port postgres; }

pg_init() {
	[ -f "$PGDATA_DIR/PG_VERSION" ] && return 0
	say "postgres: creating a cluster in $PGDATA_DIR"
	mkdir -p "$PGHOME" "$STATE"
	is_root && chown "$PG_OWNER" "$PGHOME"
	as_pg mkdir -p "$PGSOCK"
	as_pg "$PGBIN/initdb" -D "$PGDATA_DIR" -U postgres -E UTF8 --locale=C \
		--auth-local=peer --auth-host=scram-sha-256 >>"$STATE/postgres-init.log" 2>&1 ||
		fail_start postgres "$STATE/postgres-init.log" "initdb failed"
	as_pg tee -a "$PGDATA_DIR/postgresql.conf" >/dev/null <<EOF

# ferry (compose/local/services.sh): loopback only; tests and benchmarks
# open many connections.
listen_addresses = '127.0.0.1'
unix_socket_directories = '$PGSOCK'
max_connections = 300
shared_buffers = 256MB
work_mem = 8MB
EOF
	if [ "$PGHOME" != "$STATE/postgres" ]; then ln -sfn "$PGHOME" "$STATE/postgres"; fi
}

psql_admin() {
	as_pg "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$PGSOCK" -p "$(pg_port)" -U postgres -d postgres "$@"
}

start_postgres() {
	pg_vars || die "postgres: $PG_ERR"
	if [ -n "$(pg_pid)" ]; then
		say "postgres: already running on 127.0.0.1:$(pg_port)"
	else
		pg_init
		local port
		port=$(choose_port postgres $DEF_PG)
		as_pg mkdir -p "$PGSOCK"
		as_pg touch "$PGLOG"
		ln -sfn "$PGLOG" "$STATE/postgres.log"
		say "postgres: starting on 127.0.0.1:$port"
		# pg_stat_statements is preloaded (when the package ships it) so
		# the benchmarks can count statements per event; loaded, it only
		# counts (the view exists where the extension is created: database
		# ferry). Given on the command line, so clusters created before
		# this line get it too.
		# wal_level=logical for the WAL relay (outbox/wal.go; ferry relay
		# --mode=wal), also on the command line so that older clusters
		# get it at their next start.
		local opts="-p $port $PG_WAL_OPTS"
		[ -f "$("$PGBIN/pg_config" --pkglibdir 2>/dev/null || echo "$PGBIN/../lib")/pg_stat_statements.so" ] &&
			opts="$opts -c shared_preload_libraries=pg_stat_statements"
		as_pg bash -c "$CLOSE_FDS"'exec "$@"' pg_ctl "$PGBIN/pg_ctl" -D "$PGDATA_DIR" -l "$PGLOG" -w -t "$START_TIMEOUT" -o "$opts" start </dev/null >/dev/null 2>&1 ||
			fail_start postgres "$PGLOG" "pg_ctl start failed"
	fi
	# A server started before wal_level=logical was given (by an older
	# services.sh) needs a restart to change it.
	if [ "$(psql_admin -tAc "SHOW wal_level")" != logical ]; then
		say "postgres: restarting to set wal_level=logical (the WAL relay needs it)"
		local o
		o=$(psql_admin -tAc "SELECT '-p ' || current_setting('port') || ' -c shared_preload_libraries=' || quote_literal(current_setting('shared_preload_libraries'))")
		as_pg bash -c "$CLOSE_FDS"'exec "$@"' pg_ctl "$PGBIN/pg_ctl" -D "$PGDATA_DIR" -l "$PGLOG" -w -t "$START_TIMEOUT" -m fast -o "$o $PG_WAL_OPTS" restart </dev/null >/dev/null 2>&1 ||
			fail_start postgres "$PGLOG" "pg_ctl restart failed"
	fi
	# Provision: role ferry with this checkout's password (may create
	# databases: tests do), the setting ferry.checkout the tests check, and
	# database ferry. Idempotent.
	psql_admin -c "DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ferry') THEN
    CREATE ROLE ferry LOGIN CREATEDB PASSWORD '$CHECKOUT';
  ELSE
    ALTER ROLE ferry LOGIN CREATEDB PASSWORD '$CHECKOUT';
  END IF;
END \$\$;
ALTER ROLE ferry SET ferry.checkout = '$CHECKOUT';
ALTER ROLE ferry REPLICATION;" || die "postgres: could not create role ferry"
	if [ "$(psql_admin -tAc "SELECT 1 FROM pg_database WHERE datname = 'ferry'")" != 1 ]; then
		psql_admin -c "CREATE DATABASE ferry OWNER ferry" || die "postgres: could not create database ferry"
	fi
	# The pg_stat_statements view, in database ferry (it shows the
	# statements of every database; bench/ reads it), when preloaded.
	if [ "$(psql_admin -tAc "SELECT 1 FROM pg_settings WHERE name = 'shared_preload_libraries' AND setting LIKE '%pg_stat_statements%'")" = 1 ]; then
		psql_admin -d ferry -c "SET client_min_messages = warning" -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" || die "postgres: could not create extension pg_stat_statements"
	fi
}

stop_postgres() {
	pg_vars || return 0
	[ -n "$(pg_pid)" ] || return 0
	say "postgres: stopping"
	as_pg "$PGBIN/pg_ctl" -D "$PGDATA_DIR" -m fast -w -t 60 stop >/dev/null 2>&1 || {
		local pid
		pid=$(pg_pid)
		[ -z "$pid" ] || stop_pid postgres "$pid"
	}
}

status_postgres() {
	pg_vars || { echo "not installed"; return; }
	local pid
	pid=$(pg_pid)
	if [ -n "$pid" ]; then
		echo "running  pid $pid  127.0.0.1:$(pg_port)  data $PGDATA_DIR"
	else
		echo "stopped"
	fi
}

env_postgres() {
	echo "export FERRY_DATABASE_URL=postgres://ferry:$CHECKOUT@127.0.0.1:$(pg_port)/ferry"
	echo "export FERRY_POSTGRES_CHECKOUT=$CHECKOUT"
}

# ------------------------------------------------------------ rabbitmq

RMQ_DIR=$STATE/rabbitmq
RMQ_PIDFILE=$RMQ_DIR/rabbit.pid
RMQ_LOG=$STATE/rabbitmq.log
RMQ_AUTH=Z3Vlc3Q6Z3Vlc3Q= # guest:guest

# rmq_node: the node's name, kept in the state so it never changes under
# its data; unique per state folder, so two checkouts can run side by side.
rmq_node() {
	if [ -n "${FERRY_RABBITMQ_NODENAME:-}" ]; then
		echo "$FERRY_RABBITMQ_NODENAME"
	elif [ -s "$RMQ_DIR/nodename" ]; then
		cat "$RMQ_DIR/nodename"
	else
		echo "$CHECKOUT@localhost"
	fi
}

rmq_env() {
	RMQ_NODE=$(rmq_node)
	export RABBITMQ_NODENAME=$RMQ_NODE
	export RABBITMQ_USE_LONGNAME=false
	export RABBITMQ_CONF_ENV_FILE=$RMQ_DIR/rabbitmq-env.conf
	export RABBITMQ_CONFIG_FILE=$RMQ_DIR/rabbitmq.conf
	export RABBITMQ_ADVANCED_CONFIG_FILE=$RMQ_DIR/advanced.config
	export RABBITMQ_ENABLED_PLUGINS_FILE=$RMQ_DIR/enabled_plugins
	export RABBITMQ_MNESIA_BASE=$RMQ_DIR/mnesia
	export RABBITMQ_LOG_BASE=$RMQ_DIR/log
	export RABBITMQ_LOGS=$RMQ_LOG
	export RABBITMQ_PID_FILE=$RMQ_PIDFILE
}

rmq_pid() {
	local pid
	pid=$(pidfile_pid "$RMQ_PIDFILE")
	# Ours: a beam whose environment names our data folder.
	pid_alive "$pid" && grep -qa beam "/proc/$pid/cmdline" 2>/dev/null &&
		grep -qaF -- "RABBITMQ_MNESIA_BASE=$RMQ_DIR/mnesia" "/proc/$pid/environ" 2>/dev/null && echo "$pid"
	return 0
}

# http_body PORT PATH [BASIC_AUTH_B64]: prints the body of GET.
http_body() {
	(
		exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
		auth=""
		[ -n "${3:-}" ] && auth="Authorization: Basic $3"$'\r\n'
		printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1:%s\r\n%sConnection: close\r\n\r\n' "$2" "$1" "$auth" >&3
		timeout 10 cat <&3 | sed '1,/^\r\{0,1\}$/d'
	) 2>/dev/null
}

# rmq_ready: our node answers on our ports (a node of another checkout that
# took a port is not ready: its name differs).
rmq_ready() {
	local body
	tcp_ok "$(saved_port rabbitmq)" &&
		body=$(http_body "$(saved_port rabbitmq-management)" /api/overview "$RMQ_AUTH") &&
		grep -qF "\"node\":\"$(rmq_node)\"" <<<"$body"
}

# rmq_provision: this checkout's user (administrator, all permissions on
# vhost /). guest stays for the CLI's default URL.
rmq_provision() {
	rmq_env
	local ctl=$RMQ_BIN/rabbitmqctl
	if "$ctl" -q authenticate_user "$CHECKOUT" "$CHECKOUT" >/dev/null 2>&1; then return 0; fi
	say "rabbitmq: adding user $CHECKOUT"
	"$ctl" -q add_user "$CHECKOUT" "$CHECKOUT" >/dev/null 2>&1 || "$ctl" -q change_password "$CHECKOUT" "$CHECKOUT" >/dev/null ||
		die "rabbitmq: could not add user $CHECKOUT"
	"$ctl" -q set_user_tags "$CHECKOUT" administrator >/dev/null || die "rabbitmq: could not tag user $CHECKOUT"
	"$ctl" -q set_permissions -p / "$CHECKOUT" '.*' '.*' '.*' >/dev/null || die "rabbitmq: could not set permissions of $CHECKOUT"
}

start_rabbitmq() {
	[ -x "$RMQ_BIN/rabbitmq-server" ] || die "rabbitmq: RabbitMQ is not installed (run: $0 up rabbitmq)"
	if [ -n "$(rmq_pid)" ]; then
		if rmq_ready; then
			say "rabbitmq: already running on 127.0.0.1:$(saved_port rabbitmq)"
			rmq_provision
			return 0
		fi
	else
		local amqp http dist
		amqp=$(choose_port rabbitmq $DEF_AMQP)
		http=$(choose_port rabbitmq-management $DEF_RMQ_HTTP)
		dist=$(choose_port rabbitmq-dist $DEF_RMQ_DIST)
		mkdir -p "$RMQ_DIR/mnesia" "$RMQ_DIR/log"
		: >"$RMQ_DIR/rabbitmq-env.conf"
		echo '[rabbitmq_management].' >"$RMQ_DIR/enabled_plugins"
		cat >"$RMQ_DIR/rabbitmq.conf" <<EOF
# written by compose/local/services.sh on each start
listeners.tcp.1 = 127.0.0.1:$amqp
management.tcp.ip = 127.0.0.1
management.tcp.port = $http
EOF
		rmq_env
		echo "$RMQ_NODE" >"$RMQ_DIR/nodename"
		export RABBITMQ_DIST_PORT=$dist
		export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
		# epmd first, detached, so no CLI call leaves it holding our stdout.
		command -v epmd >/dev/null && bash -c "$CLOSE_FDS"'exec epmd -daemon' </dev/null >/dev/null 2>&1 || true
		say "rabbitmq: starting node $RMQ_NODE on 127.0.0.1:$amqp (management :$http)"
		spawn rabbitmq "$RMQ_DIR/wrapper.pid" "$STATE/rabbitmq.out" "$RMQ_BIN/rabbitmq-server"
	fi
	local i
	for i in $(seq $((START_TIMEOUT * 4))); do
		rmq_ready && { rmq_provision; say "rabbitmq: ready"; return 0; }
		if [ "$i" -gt 40 ] && [ -z "$(rmq_pid)" ] && ! pid_alive "$(pidfile_pid "$RMQ_DIR/wrapper.pid")"; then
			cat "$STATE/rabbitmq.out" >>"$RMQ_LOG" 2>/dev/null || true
			fail_start rabbitmq "$RMQ_LOG" "the node exited during start (see also $STATE/rabbitmq.out)"
		fi
		sleep 0.25
	done
	fail_start rabbitmq "$RMQ_LOG" "not ready after ${START_TIMEOUT}s"
}

stop_rabbitmq() {
	local pid
	pid=$(rmq_pid)
	[ -n "$pid" ] || return 0
	say "rabbitmq: stopping"
	stop_pid rabbitmq "$pid"
	stop_pid rabbitmq "$(pidfile_pid "$RMQ_DIR/wrapper.pid")"
}

status_rabbitmq() {
	local pid
	pid=$(rmq_pid)
	if [ -n "$pid" ]; then
		local r=starting
		rmq_ready && r=running
		echo "$r  pid $pid  amqp 127.0.0.1:$(saved_port rabbitmq)  management http://127.0.0.1:$(saved_port rabbitmq-management)  node $(rmq_node)"
	else
		echo "stopped"
	fi
}

env_rabbitmq() {
	echo "export FERRY_RABBITMQ_URL=amqp://$CHECKOUT:$CHECKOUT@127.0.0.1:$(saved_port rabbitmq)/"
	echo "export FERRY_RABBITMQ_MANAGEMENT_URL=http://$CHECKOUT:$CHECKOUT@127.0.0.1:$(saved_port rabbitmq-management)"
	echo "export FERRY_RABBITMQ_NODE=$(rmq_node)"
}

# ------------------------------------------------------------ smtp (Mailpit)

SMTP_PIDFILE=$STATE/smtp.pid

smtp_pid() {
	local pid
	pid=$(pidfile_pid "$SMTP_PIDFILE")
	pid_alive "$pid" && grep -qaF -- "$STATE/mailpit/" "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
	return 0
}

smtp_ready() { tcp_ok "$(saved_port smtp)" && [ "$(http_status "$(saved_port smtp-http)" /readyz)" = 200 ]; }

start_smtp() {
	local bin
	bin=$(go_tool mailpit "$MAILPIT_MODULE" "$MAILPIT_VERSION")
	if [ -n "$(smtp_pid)" ]; then
		if smtp_ready; then
			say "smtp: already running on 127.0.0.1:$(saved_port smtp)"
			return 0
		fi
	else
		local smtp http
		smtp=$(choose_port smtp $DEF_SMTP)
		http=$(choose_port smtp-http $DEF_SMTP_HTTP)
		mkdir -p "$STATE/mailpit"
		say "smtp: starting Mailpit, SMTP 127.0.0.1:$smtp, HTTP http://127.0.0.1:$http"
		spawn smtp "$SMTP_PIDFILE" "$STATE/smtp.log" "$bin" \
			--smtp "127.0.0.1:$smtp" --listen "127.0.0.1:$http" \
			--database "$STATE/mailpit/mailpit.db" --max 100000 \
			--smtp-auth-accept-any --smtp-auth-allow-insecure \
			--smtp-disable-rdns --disable-version-check
	fi
	wait_ready smtp "Mailpit"
}

stop_smtp() { stop_if_running smtp "$(smtp_pid)"; }

status_smtp() {
	local pid
	pid=$(smtp_pid)
	if [ -n "$pid" ]; then
		echo "running  pid $pid  smtp 127.0.0.1:$(saved_port smtp)  http http://127.0.0.1:$(saved_port smtp-http)  (Mailpit)"
	else
		echo "stopped"
	fi
}

env_smtp() {
	echo "export FERRY_SMTP_ADDR=127.0.0.1:$(saved_port smtp)"
	echo "export FERRY_MAILPIT_URL=http://127.0.0.1:$(saved_port smtp-http)"
}

# ------------------------------------------------------------ nats

NATS_PIDFILE=$STATE/nats.pid

nats_pid() {
	local pid
	pid=$(pidfile_pid "$NATS_PIDFILE")
	pid_alive "$pid" && grep -qaF -- "$STATE/nats" "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
	return 0
}

# nats_ready: our server answers on our ports (another checkout's server
# that took a port has another name).
nats_ready() {
	local body
	tcp_ok "$(saved_port nats)" && [ "$(http_status "$(saved_port nats-monitor)" /healthz)" = 200 ] &&
		body=$(http_body "$(saved_port nats-monitor)" /varz) &&
		grep -qE "\"server_name\": *\"$CHECKOUT\"" <<<"$body"
}

start_nats() {
	local bin
	bin=$(go_tool nats-server "$NATS_MODULE" "$NATS_VERSION")
	if [ -n "$(nats_pid)" ] && ! grep -qaF -- "$CHECKOUT" "/proc/$(nats_pid)/cmdline" 2>/dev/null; then
		say "nats: restarting to apply this checkout's server name and password"
		stop_nats
	fi
	if [ -n "$(nats_pid)" ]; then
		if nats_ready; then
			say "nats: already running on 127.0.0.1:$(saved_port nats)"
			return 0
		fi
	else
		local port mon
		port=$(choose_port nats $DEF_NATS)
		mon=$(choose_port nats-monitor $DEF_NATS_HTTP)
		mkdir -p "$STATE/nats"
		say "nats: starting nats-server (JetStream) on 127.0.0.1:$port (monitor :$mon)"
		spawn nats "$NATS_PIDFILE" "$STATE/nats.log" "$bin" \
			-n "$CHECKOUT" --user ferry --pass "$CHECKOUT" -js -sd "$STATE/nats" -a 127.0.0.1 -p "$port" -m "$mon"
	fi
	wait_ready nats "nats-server"
}

stop_nats() { stop_if_running nats "$(nats_pid)"; }

status_nats() {
	local pid
	pid=$(nats_pid)
	if [ -n "$pid" ]; then
		echo "running  pid $pid  127.0.0.1:$(saved_port nats)  monitor http://127.0.0.1:$(saved_port nats-monitor)  store $STATE/nats"
	else
		echo "stopped"
	fi
}

env_nats() {
	echo "export FERRY_NATS_URL=nats://ferry:$CHECKOUT@127.0.0.1:$(saved_port nats)"
	echo "export FERRY_NATS_SERVER_NAME=$CHECKOUT"
}

# ------------------------------------------------------------ kafka

# Apache Kafka in KRaft mode: broker and controller in one JVM on the
# machine's Java 17. The jars come from Maven (`mvn dependency:copy-dependencies`
# on a small pom) and are cached in $STATE/kafka-lib-$KAFKA_VERSION.
KAFKA_DIR=$STATE/kafka
KAFKA_LIB=$STATE/kafka-lib-$KAFKA_VERSION
KAFKA_PIDFILE=$STATE/kafka.pid
KAFKA_HEAP=${FERRY_KAFKA_HEAP:--Xmx512m -Xms128m}

# kafka_cluster_id prints a new KRaft cluster id: 16 random bytes in
# URL-safe base64 without padding (22 characters), as kafka-storage
# random-uuid prints them, never starting with "-": the storage tool's
# argument parser would take such an id for an option ("argument
# --cluster-id/-t: expected one argument"), one id in 64; Kafka's own
# Uuid.randomUuid draws again in that case too.
kafka_cluster_id() {
	local id
	while :; do
		id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | head -c 22)
		[ "${id#-}" = "$id" ] && break
	done
	printf '%s\n' "$id"
}

kafka_jars() {
	[ -f "$KAFKA_LIB/.complete" ] && return 0
	local pkgs=()
	command -v java >/dev/null || pkgs+=(openjdk-17-jre-headless)
	command -v mvn >/dev/null || pkgs+=(maven)
	[ ${#pkgs[@]} -eq 0 ] || apt_install "${pkgs[@]}"
	say "kafka: fetching the Kafka $KAFKA_VERSION jars with mvn (first time only)"
	local pom=$STATE/kafka-pom
	mkdir -p "$pom" "$KAFKA_LIB"
	cat >"$pom/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>ferry.local</groupId>
  <artifactId>kafka-server</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_$KAFKA_SCALA</artifactId>
      <version>$KAFKA_VERSION</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-reload4j</artifactId>
      <version>$SLF4J_VERSION</version>
    </dependency>
  </dependencies>
</project>
EOF
	(cd "$pom" && mvn -q -B dependency:copy-dependencies -DoutputDirectory="$KAFKA_LIB" -DincludeScope=runtime) </dev/null >"$STATE/kafka-mvn.log" 2>&1 ||
		fail_start kafka "$STATE/kafka-mvn.log" "mvn dependency:copy-dependencies failed"
	touch "$KAFKA_LIB/.complete"
}

kafka_pid() {
	local pid
	pid=$(pidfile_pid "$KAFKA_PIDFILE")
	pid_alive "$pid" && grep -qaF -- "$KAFKA_DIR/server.properties" "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
	return 0
}

# kafka_ready: the broker port accepts connections and the broker's log
# says it finished starting since the last start.
kafka_ready() {
	tcp_ok "$(saved_port kafka)" && grep -q 'Kafka Server started' "$KAFKA_DIR/current.log" 2>/dev/null
}

start_kafka() {
	kafka_jars
	if [ -n "$(kafka_pid)" ]; then
		if kafka_ready; then
			say "kafka: already running on 127.0.0.1:$(saved_port kafka)"
			return 0
		fi
	else
		local port ctl
		port=$(choose_port kafka $DEF_KAFKA)
		ctl=$(choose_port kafka-controller $DEF_KAFKA_CONTROLLER)
		mkdir -p "$KAFKA_DIR/data"
		cat >"$KAFKA_DIR/server.properties" <<EOF
# written by compose/local/services.sh on each start
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$ctl
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$ctl
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$KAFKA_DIR/data
num.partitions=3
default.replication.factor=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
min.insync.replicas=1
auto.create.topics.enable=false
group.initial.rebalance.delay.ms=0
log.cleaner.backoff.ms=1000
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
EOF
		cat >"$KAFKA_DIR/log4j.properties" <<EOF
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.state.change.logger=WARN
log4j.logger.kafka.log.LogCleaner=WARN
EOF
		if [ ! -f "$KAFKA_DIR/data/meta.properties" ]; then
			local uuid
			uuid=$(kafka_cluster_id)
			say "kafka: formatting the storage in $KAFKA_DIR/data (cluster $uuid)"
			java -Dlog4j.configuration="file:$KAFKA_DIR/log4j.properties" -cp "$KAFKA_LIB/*" kafka.tools.StorageTool format \
				-t "$uuid" -c "$KAFKA_DIR/server.properties" </dev/null >"$STATE/kafka-format.log" 2>&1 ||
				fail_start kafka "$STATE/kafka-format.log" "kafka.tools.StorageTool format failed"
		fi
		: >"$KAFKA_DIR/current.log"
		say "kafka: starting Kafka $KAFKA_VERSION (KRaft) on 127.0.0.1:$port (controller :$ctl)"
		# shellcheck disable=SC2086
		spawn kafka "$KAFKA_PIDFILE" "$KAFKA_DIR/current.log" java $KAFKA_HEAP -XX:+UseSerialGC \
			-Djava.awt.headless=true -Dlog4j.configuration="file:$KAFKA_DIR/log4j.properties" \
			-cp "$KAFKA_LIB/*" kafka.Kafka "$KAFKA_DIR/server.properties"
	fi
	local i
	for i in $(seq $((START_TIMEOUT * 4))); do
		kafka_ready && { say "kafka: ready"; return 0; }
		[ -n "$(kafka_pid)" ] || fail_start kafka "$KAFKA_DIR/current.log" "the broker exited during start"
		sleep 0.25
	done
	fail_start kafka "$KAFKA_DIR/current.log" "not ready after ${START_TIMEOUT}s"
}

stop_kafka() { stop_if_running kafka "$(kafka_pid)"; }

status_kafka() {
	local pid
	pid=$(kafka_pid)
	if [ -n "$pid" ]; then
		local r=starting
		kafka_ready && r=running
		echo "$r  pid $pid  127.0.0.1:$(saved_port kafka)  controller :$(saved_port kafka-controller)  data $KAFKA_DIR/data  log $KAFKA_DIR/current.log"
	else
		echo "stopped"
	fi
}

env_kafka() { echo "export FERRY_KAFKA_BROKERS=127.0.0.1:$(saved_port kafka)"; }
# Static test credentials: ElasticMQ accepts any; the SDK needs some.
env_sqs() {
	echo "export FERRY_SQS_ENDPOINT=http://127.0.0.1:$(saved_port sqs)"
	echo "export FERRY_AWS_REGION=us-east-1"
	echo "export AWS_ACCESS_KEY_ID=ferry"
	echo "export AWS_SECRET_ACCESS_KEY=ferry"
}

# ------------------------------------------------------------ sqs (ElasticMQ)

SQS_DIR=$STATE/elasticmq
SQS_PIDFILE=$STATE/sqs.pid

# java_ok: a java of version 17 or later is on the PATH.
java_ok() {
	command -v java >/dev/null || return 1
	local v
	v=$(java -version 2>&1 | sed -n '1s/.*version "\([0-9]*\).*/\1/p')
	[ -n "$v" ] && [ "$v" -ge 17 ]
}

# sqs_jars: fetch ElasticMQ's server and its dependencies once (Maven's
# dependency:copy-dependencies on a pom naming it) into $SQS_DIR/lib.
sqs_jars() {
	local lib=$SQS_DIR/lib stamp=$SQS_DIR/lib/.version
	if [ "$(cat "$stamp" 2>/dev/null)" = "$ELASTICMQ_ARTIFACT:$ELASTICMQ_VERSION" ]; then return 0; fi
	command -v mvn >/dev/null || die "sqs: Maven is needed to fetch ElasticMQ (run: $0 up sqs)"
	say "sqs: fetching $ELASTICMQ_ARTIFACT:$ELASTICMQ_VERSION with Maven (first time only)"
	rm -rf "$lib"
	mkdir -p "$SQS_DIR/pom"
	cat >"$SQS_DIR/pom/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <!-- written by compose/local/services.sh: ElasticMQ's runtime jars -->
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.ferry</groupId>
  <artifactId>elasticmq-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>${ELASTICMQ_ARTIFACT%%:*}</groupId>
      <artifactId>${ELASTICMQ_ARTIFACT#*:}</artifactId>
      <version>$ELASTICMQ_VERSION</version>
    </dependency>
  </dependencies>
</project>
EOF
	(cd "$SQS_DIR/pom" && mvn -q -B dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$lib") </dev/null >"$SQS_DIR/maven.log" 2>&1 ||
		fail_start sqs "$SQS_DIR/maven.log" "mvn dependency:copy-dependencies failed"
	ls "$lib"/elasticmq-server_*.jar >/dev/null 2>&1 || fail_start sqs "$SQS_DIR/maven.log" "Maven did not fetch the ElasticMQ server jar"
	echo "$ELASTICMQ_ARTIFACT:$ELASTICMQ_VERSION" >"$stamp"
}

sqs_pid() {
	local pid
	pid=$(pidfile_pid "$SQS_PIDFILE")
	pid_alive "$pid" && grep -qaF -- "$SQS_DIR/elasticmq.conf" "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
	return 0
}

# sqs_ready: ListQueues (the query protocol) answers 200.
sqs_ready() {
	tcp_ok "$(saved_port sqs)" && [ "$(http_status "$(saved_port sqs)" "/?Action=ListQueues")" = 200 ]
}

start_sqs() {
	java_ok || die "sqs: Java 17 or later is not installed (run: $0 up sqs)"
	sqs_jars
	local paused
	paused=$(sqs_pid)
	if [ -n "$paused" ] && sqs_paused "$paused"; then
		say "sqs: resuming ElasticMQ (SIGCONT)"
		kill -CONT "$paused" 2>/dev/null || true
	fi
	if [ -n "$(sqs_pid)" ]; then
		if sqs_ready; then
			say "sqs: already running on 127.0.0.1:$(saved_port sqs)"
			return 0
		fi
	else
		local port
		port=$(choose_port sqs $DEF_SQS)
		mkdir -p "$SQS_DIR/data"
		# Loopback only, AWS's limits (strict), no statistics server, and
		# queues (queues.conf) and messages (H2) kept across stop/start
		# unless FERRY_ELASTICMQ_STORE=memory.
		local store=""
		case $ELASTICMQ_STORE in
		h2) store="queues-storage {
  enabled = true
  path = \"$SQS_DIR/data/queues.conf\"
}
messages-storage {
  enabled = true
  uri = \"jdbc:h2:$SQS_DIR/data/messages;WRITE_DELAY=0\"
}" ;;
		memory) ;;
		*) die "sqs: FERRY_ELASTICMQ_STORE=$ELASTICMQ_STORE: want h2 or memory" ;;
		esac
		cat >"$SQS_DIR/elasticmq.conf" <<EOF
# written by compose/local/services.sh on each start
include classpath("application.conf")
node-address {
  protocol = http
  host = "127.0.0.1"
  port = $port
  context-path = ""
}
rest-sqs {
  enabled = true
  bind-port = $port
  bind-hostname = "127.0.0.1"
  sqs-limits = strict
}
rest-stats {
  enabled = false
  bind-port = 0
  bind-hostname = "127.0.0.1"
}
generate-node-address = false
$store
aws {
  region = us-east-1
  accountId = "000000000000"
}
EOF
		say "sqs: starting ElasticMQ $ELASTICMQ_VERSION on 127.0.0.1:$port"
		spawn sqs "$SQS_PIDFILE" "$STATE/sqs.log" java -Xmx"$ELASTICMQ_XMX" -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
			-Dconfig.file="$SQS_DIR/elasticmq.conf" -cp "$SQS_DIR/lib/*" org.elasticmq.server.Main
	fi
	wait_ready sqs "ElasticMQ"
}

# stop_sqs pauses ElasticMQ (SIGSTOP) instead of stopping it, and
# start_sqs resumes a paused one (SIGCONT): ElasticMQ 1.6.11 answers a send
# before its message store has it, so a real stop, SIGTERM or SIGKILL, loses
# messages it has confirmed (seen: 38 to 47 per stop in the outage tests, its
# log saying "Failed to notify queue event listener"). To its clients a
# paused server is an outage (connections hang until their deadline) that
# keeps every message. `down` and `reset` stop it for real (SQS_REAL_STOP).
sqs_paused() { [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" = T ]; }

stop_sqs() {
	local pid
	pid=$(sqs_pid)
	[ -n "$pid" ] || return 0
	if [ -n "${SQS_REAL_STOP:-}" ]; then
		kill -CONT "$pid" 2>/dev/null || true
		stop_if_running sqs "$pid"
		return 0
	fi
	say "sqs: pausing ElasticMQ (SIGSTOP; 'down sqs' stops it)"
	kill -STOP "$pid" 2>/dev/null || true
}

status_sqs() {
	local pid
	pid=$(sqs_pid)
	if [ -n "$pid" ]; then
		local r=running
		sqs_paused "$pid" && r=paused
		echo "$r  pid $pid  http://127.0.0.1:$(saved_port sqs)  (ElasticMQ $ELASTICMQ_VERSION)  data $SQS_DIR/data"
	else
		echo "stopped"
	fi
}

# Static test credentials: ElasticMQ accepts any; the SDK needs some.
env_sqs() {
	echo "export FERRY_SQS_ENDPOINT=http://127.0.0.1:$(saved_port sqs)"
	echo "export FERRY_AWS_REGION=us-east-1"
	echo "export AWS_ACCESS_KEY_ID=ferry"
	echo "export AWS_SECRET_ACCESS_KEY=ferry"
}

# ------------------------------------------------------------ moto (second SQS server)

MOTO_DIR=$STATE/moto
MOTO_PIDFILE=$STATE/moto.pid

# moto_venv: install moto[server] $MOTO_VERSION with pip into a virtual
# environment under $MOTO_DIR (first time only, or when the version
# changes).
moto_venv() {
	local venv=$MOTO_DIR/venv stamp=$MOTO_DIR/venv/.version
	if [ "$(cat "$stamp" 2>/dev/null)" = "$MOTO_VERSION" ] && [ -x "$venv/bin/moto_server" ]; then return 0; fi
	command -v python3 >/dev/null || die "moto: Python 3 is needed (run: $0 up moto)"
	say "moto: pip install moto[server]==$MOTO_VERSION into $venv (first time only)"
	rm -rf "$venv"
	mkdir -p "$MOTO_DIR"
	{ python3 -m venv "$venv" && "$venv/bin/pip" install -q "moto[server]==$MOTO_VERSION"; } </dev/null >"$MOTO_DIR/pip.log" 2>&1 ||
		fail_start moto "$MOTO_DIR/pip.log" "pip install moto[server]==$MOTO_VERSION failed"
	[ -x "$venv/bin/moto_server" ] || fail_start moto "$MOTO_DIR/pip.log" "pip did not install moto_server"
	echo "$MOTO_VERSION" >"$stamp"
}

moto_pid() {
	local pid
	pid=$(pidfile_pid "$MOTO_PIDFILE")
	pid_alive "$pid" && grep -qaF -- "$MOTO_DIR/venv/" "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
	return 0
}

# moto_ready: ListQueues (the query protocol) answers 200.
moto_ready() {
	tcp_ok "$(saved_port moto)" && [ "$(http_status "$(saved_port moto)" "/?Action=ListQueues")" = 200 ]
}

# moto keeps everything in memory: a real stop loses its queues and
# messages. So, as for ElasticMQ, stop_moto pauses it (SIGSTOP), an outage
# that keeps every message, and start_moto resumes a paused one; `down` and
# `reset` stop it for real (SQS_REAL_STOP).
start_moto() {
	moto_venv
	local paused
	paused=$(moto_pid)
	if [ -n "$paused" ] && sqs_paused "$paused"; then
		say "moto: resuming moto_server (SIGCONT)"
		kill -CONT "$paused" 2>/dev/null || true
	fi
	if [ -n "$(moto_pid)" ]; then
		if moto_ready; then
			say "moto: already running on 127.0.0.1:$(saved_port moto)"
			return 0
		fi
	else
		local port
		port=$(choose_port moto $DEF_MOTO)
		say "moto: starting moto_server $MOTO_VERSION on 127.0.0.1:$port"
		spawn moto "$MOTO_PIDFILE" "$STATE/moto.log" "$MOTO_DIR/venv/bin/moto_server" -H 127.0.0.1 -p "$port"
	fi
	wait_ready moto "moto_server"
}

stop_moto() {
	local pid
	pid=$(moto_pid)
	[ -n "$pid" ] || return 0
	if [ -n "${SQS_REAL_STOP:-}" ]; then
		kill -CONT "$pid" 2>/dev/null || true
		stop_if_running moto "$pid"
		return 0
	fi
	say "moto: pausing moto_server (SIGSTOP; 'down moto' stops it)"
	kill -STOP "$pid" 2>/dev/null || true
}

status_moto() {
	local pid
	pid=$(moto_pid)
	if [ -n "$pid" ]; then
		local r=running
		sqs_paused "$pid" && r=paused
		echo "$r  pid $pid  http://127.0.0.1:$(saved_port moto)  (moto $MOTO_VERSION, in memory)"
	else
		echo "stopped"
	fi
}

# The same static credentials and region as env_sqs.
env_moto() { echo "export FERRY_SQS_MOTO_ENDPOINT=http://127.0.0.1:$(saved_port moto)"; }

# ------------------------------------------------------------ reset

# reset_NAME: forget a stopped server's data, ports and logs.
reset_postgres() {
	if pg_vars && [ "$PGHOME" != "$STATE/postgres" ]; then rm -rf "$PGHOME"; fi
	rm -rf "$STATE/postgres" "$STATE/postgres.log" "$STATE/postgres-init.log" "$STATE/ports/postgres"
}
reset_rabbitmq() { rm -rf "$RMQ_DIR" "$RMQ_LOG" "$STATE/rabbitmq.out" "$STATE"/ports/rabbitmq*; }
reset_smtp() { rm -rf "$STATE/mailpit" "$STATE/smtp.log" "$SMTP_PIDFILE" "$STATE"/ports/smtp*; }
reset_nats() { rm -rf "$STATE/nats" "$STATE/nats.log" "$NATS_PIDFILE" "$STATE"/ports/nats*; }
reset_kafka() { rm -rf "$KAFKA_DIR" "$STATE/kafka.log" "$KAFKA_PIDFILE" "$STATE"/ports/kafka*; }
# The fetched jars (lib/) are kept: they are not data.
reset_sqs() { rm -rf "$SQS_DIR/data" "$SQS_DIR/elasticmq.conf" "$STATE/sqs.log" "$SQS_PIDFILE" "$STATE"/ports/sqs*; }
# The virtual environment (venv/) is kept: it is not data.
reset_moto() { rm -rf "$STATE/moto.log" "$MOTO_PIDFILE" "$STATE/ports/moto"; }

# ------------------------------------------------------------ main

running() { # NAME: true if the server's process is alive
	case $1 in
	postgres) pg_vars && [ -n "$(pg_pid)" ] ;;
	rabbitmq) [ -n "$(rmq_pid)" ] ;;
	smtp) [ -n "$(smtp_pid)" ] ;;
	nats) [ -n "$(nats_pid)" ] ;;
	kafka) [ -n "$(kafka_pid)" ] ;;
	sqs) [ -n "$(sqs_pid)" ] ;;
	moto) [ -n "$(moto_pid)" ] ;;
	esac
}

lock() {
	mkdir -p "$STATE"
	if command -v flock >/dev/null; then
		exec 9>"$STATE/.lock"
		flock -w 900 9 || die "another services.sh is still running (lock $STATE/.lock)"
	fi
}

# cluster.sh sources this file for its helpers, without the main part.
[ -z "${FERRY_SERVICES_LIB:-}" ] || return 0

cmd=${1:-}
[ -n "$cmd" ] || usage
shift
case " $cmd $* " in
*" node "* | *" promote "* | *-cluster* | *" postgres-ha "*) exec bash "$HERE/cluster.sh" "$cmd" "$@" ;;
esac
if [ "$cmd" = netns ]; then
	lock
	ensure_packages netns
	echo "export FERRY_NFT=$(command -v nft)"
	echo "export FERRY_NATS_SERVER=$(go_tool nats-server "$NATS_MODULE" "$NATS_VERSION")"
	exit 0
fi
if [ "$cmd" = rabbitmqctl ]; then
	rmq_env
	exec "$RMQ_BIN/rabbitmqctl" "$@"
fi
names=("$@")
[ ${#names[@]} -gt 0 ] || names=("${ALL[@]}")
for n in "${names[@]}"; do
	case $n in
	postgres | rabbitmq | smtp | nats | kafka | sqs | moto) ;;
	*) die "unknown service '$n' (known: ${ALL[*]})" ;;
	esac
done

case $cmd in
up | start)
	lock
	ensure_packages "${names[@]}"
	for n in "${names[@]}"; do start_service "$n"; done
	;;
stop)
	lock
	for n in "${names[@]}"; do "stop_$n"; done
	;;
down)
	lock
	SQS_REAL_STOP=1
	for n in "${names[@]}"; do "stop_$n"; done
	for n in "${names[@]}"; do
		case $n in
		postgres) rm -f "$STATE/ports/postgres" ;;
		rabbitmq) rm -f "$STATE/ports/rabbitmq" "$STATE/ports/rabbitmq-management" "$STATE/ports/rabbitmq-dist" ;;
		smtp) rm -f "$STATE/ports/smtp" "$STATE/ports/smtp-http" ;;
		nats) rm -f "$STATE/ports/nats" "$STATE/ports/nats-monitor" ;;
		kafka) rm -f "$STATE/ports/kafka" "$STATE/ports/kafka-controller" ;;
		sqs) rm -f "$STATE/ports/sqs" ;;
		moto) rm -f "$STATE/ports/moto" ;;
		esac
	done
	;;
reset)
	lock
	SQS_REAL_STOP=1
	for n in "${names[@]}"; do "stop_$n"; done
	for n in "${names[@]}"; do reset_$n; done
	;;
restart)
	lock
	ensure_packages "${names[@]}"
	for n in "${names[@]}"; do "stop_$n"; done
	for n in "${names[@]}"; do start_service "$n"; done
	;;
status)
	for n in "${names[@]}"; do printf '%-9s %s\n' "$n" "$("status_$n")"; done
	;;
env)
	for n in "${names[@]}"; do
		if running "$n"; then "env_$n"; else echo "# $n is not running (start it: $0 up $n)"; fi
	done
	;;
*) usage ;;
esac
