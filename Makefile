# ferry's developer commands. `make test` is what CI runs (.ci/run).
#
#   make test       start the servers (compose/local/services.sh up), install
#                   chromium for the console's browser tests (compose/local/
#                   chromium.sh), point the tests at them and run every
#                   package's tests, one at a time (about 45 minutes on a
#                   clean 2-core machine, installs included; the last run
#                   on a clean clone took 2755 s)
#   make test-long  the tests too slow for CI: SQS FIFO's 5-minute
#                   deduplication window, waited out on ElasticMQ and moto,
#                   and the worker suite on moto
#   make test-flow-long  the rate-limit test over 30 s instead of 10 s, on
#                   every broker (flow_integration_test.go)
#   make test-cluster  the failover and partition tests (internal/cluster)
#                   with long phases: 15 s of load around each fault on each
#                   cluster, partition faults held 3x as long, and the Kafka
#                   and RabbitMQ partition fault tests make test leaves out
#   make bench      print the throughput and latency figures (bench/README.md)
#   make bench-failover  ferry bench's failover scenario on the RabbitMQ, Kafka
#                   and NATS clusters, one at a time (bench/README.md)
#   make soak       an hour at 200 events/s on one broker with a fault every
#                   3 minutes (SIGKILL of the relay, of the worker, a broker
#                   restart, in turn); prints the relay's and worker's heap,
#                   goroutines, open files and RSS, the outbox's size, the WAL
#                   held, lost and twice-applied at each fault, then whether
#                   each stayed flat; fails on a lost event or an effect
#                   applied twice. SOAK_BROKER=rabbitmq|kafka|nats|sqs,
#                   SOAK_DURATION=1h, SOAK_FAULT_EVERY=3m, SOAK_RATE=200,
#                   SOAK_RESTART (the restart command, {broker} its name;
#                   none: no restart), SOAK_SERVICES (what services.sh
#                   starts; empty: nothing, the URLs come from FERRY_*_URL,
#                   e.g. a cluster's). See bench/README.md, "Soak".
#   make compare    ferry and Watermill's outbox side by side (bench/compare.sh)
#   make services   start the servers and print their addresses
#   make services-down
#   make demo       the sample end to end with embedded servers (no install)
#   make build      ./ferry (git-ignored)
#   make vet

SHELL    := /bin/bash
SERVICES := compose/local/services.sh
export PATH := $(PATH):/usr/local/go/bin
GO       ?= go
# -p 1: packages one at a time (outage tests stop shared servers).
TESTFLAGS ?= -p 1 -count=1 -timeout 45m
PKGS     ?= ./...
DEMO_FILE ?= $(firstword $(wildcard ../shared/data/notifications-1000.ndjson))

.PHONY: test test-long test-flow-long test-cluster tidy-check bench bench-failover soak compare services services-down services-status demo build vet

# The test binaries are built first, two packages at a time (-p 1 below
# would build them one at a time too: 176 s against 124 s from an empty
# build cache here), running no test.
test: tidy-check
	$(GO) test -count=1 -p 2 -run '^$$' $(PKGS) | { grep -vE '\[no test(s to run| files)\]$$' || true; }; test "$${PIPESTATUS[0]}" = 0
	$(SERVICES) up && $(SERVICES) netns >/dev/null && compose/local/chromium.sh >/dev/null && eval "$$($(SERVICES) env)" && $(GO) test $(TESTFLAGS) $(PKGS)

# About 8 minutes: it waits out SQS FIFO's deduplication window, which
# neither ElasticMQ nor moto can shorten (brokers/sqs/dedup_test.go), and
# runs the worker suite on moto (2 minutes, brokers/sqs/sqs_test.go).
test-long:
	$(SERVICES) up postgres sqs moto && eval "$$($(SERVICES) env postgres sqs moto)" && \
		FERRY_SQS_DEDUP_WINDOW_TEST=1 FERRY_SQS_MOTO_WORKER_SUITE=1 $(GO) test -count=1 -timeout 15m -run 'TestFIFODedup|TestWorkerSuiteMoto' -v ./brokers/sqs/

# About 40 s: TestRateLimitOnEveryBroker holding 20/s over 30 s on every
# broker at once.
test-flow-long:
	$(SERVICES) up && eval "$$($(SERVICES) env)" && \
		FERRY_FLOW_LONG=1 $(GO) test -count=1 -timeout 5m -run 'TestRateLimitOnEveryBroker' -v . | grep -E '^(=== RUN|\s*---|PASS|FAIL|ok)|flow_integration_test'; test $${PIPESTATUS[0]} = 0

# The failover tests of internal/cluster with 15 s phases (about 25
# minutes). `make test` runs them too, with 2 s phases; each test starts its
# cluster (services.sh up rabbitmq-cluster, ...) and stops it at its end.
test-cluster:
	$(SERVICES) up postgres rabbitmq && $(SERVICES) netns >/dev/null && eval "$$($(SERVICES) env postgres rabbitmq)" && \
		FERRY_CLUSTER_PHASE=15s FERRY_PARTITION_RABBITMQ=1 FERRY_PARTITION_LONG=1 $(GO) test -count=1 -timeout 60m -v -run 'TestFailover|TestPartition' ./internal/cluster/ | grep -E '^(=== RUN|---|PASS|FAIL|ok)|RESULT|PARTITION|kill|SIGSTOP|restart node|cut node|cut and heal|drop the packets|drop 5%|delay|cluster up'; test $${PIPESTATUS[0]} = 0

# go.mod must be tidy: direct dependencies not marked indirect, nothing missing.
# So must the Watermill peer's (bench/watermill, a module of its own), which
# go vet also checks: ./... does not reach into it.
tidy-check:
	@$(GO) mod tidy -diff || { echo 'go.mod is not tidy: run "go mod tidy"' >&2; exit 1; }
	@cd bench/watermill && $(GO) mod tidy -diff && $(GO) vet . || { echo 'bench/watermill: not tidy or not vetted: cd bench/watermill && go mod tidy && go vet .' >&2; exit 1; }

# The figures of bench/README.md (about 5 minutes); prints, asserts nothing.
bench:
	$(SERVICES) up && eval "$$($(SERVICES) env)" && $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 30m ./bench/

# ferry bench's failover scenario on the three clustered brokers (about 6
# minutes): each cluster is started by services.sh, its leader killed under
# 200 events/s, and stopped before the next starts; prints and writes the
# figures and the chart to bench-results/failover. Asserts nothing
# (TestBenchFailoverSmoke is the CI check, on NATS).
bench-failover:
	$(SERVICES) up postgres && eval "$$($(SERVICES) env postgres)" && \
		$(GO) run ./cmd/ferry bench --brokers rabbitmq,kafka,nats --scenarios failover --out bench-results/failover

# ferry bench's soak scenario (an hour by default; see the header). The
# broker restart goes through the same command the faults scenario uses.
SOAK_BROKER      ?= rabbitmq
SOAK_DURATION    ?= 1h
SOAK_FAULT_EVERY ?= 3m
SOAK_RATE        ?= 200
SOAK_SERVICES    ?= postgres $(SOAK_BROKER)
SOAK_RESTART     ?= $(SERVICES) restart {broker}
soak:
	$(if $(strip $(SOAK_SERVICES)),$(SERVICES) up $(SOAK_SERVICES) && eval "$$($(SERVICES) env $(SOAK_SERVICES))" &&) \
		$(GO) run ./cmd/ferry bench --brokers $(SOAK_BROKER) --scenarios soak --rate $(SOAK_RATE) \
		--soak-duration $(SOAK_DURATION) --soak-fault-every $(SOAK_FAULT_EVERY) \
		--restart-broker '$(SOAK_RESTART)' --out bench-results/soak

# ferry and the Watermill peer side by side, twice each (bench/README.md).
compare:
	$(SERVICES) up postgres rabbitmq && bench/compare.sh

services:
	$(SERVICES) up && $(SERVICES) status && $(SERVICES) env

services-down:
	$(SERVICES) down

services-status:
	$(SERVICES) status

demo:
	$(GO) run ./cmd/ferry demo $(if $(DEMO_FILE),--file $(DEMO_FILE))

build:
	$(GO) build -buildvcs=true -o ferry ./cmd/ferry

vet:
	$(GO) vet ./...
