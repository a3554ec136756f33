# ferry's developer commands. `make test` is what CI runs (.ci/run).
#
#   make test       start the servers (compose/local/services.sh up), install
#                   chromium for the console's browser tests (compose/local/
#                   chromium.sh), point the tests at them and run every
#                   package's tests, one at a time
#   make test-long  the tests too slow for CI: SQS FIFO's 5-minute
#                   deduplication window, waited out on ElasticMQ and moto,
#                   and the worker suite on moto
#   make test-cluster  the failover tests (internal/cluster) with long
#                   phases: 15 s of load around each fault on each cluster
#   make bench      print the throughput and latency figures (bench/README.md)
#   make bench-failover  ferry bench's failover scenario on the RabbitMQ, Kafka
#                   and NATS clusters, one at a time (bench/README.md)
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

.PHONY: test test-long test-cluster tidy-check bench bench-failover compare services services-down services-status demo build vet

test: tidy-check
	$(SERVICES) up && compose/local/chromium.sh >/dev/null && eval "$$($(SERVICES) env)" && $(GO) test $(TESTFLAGS) $(PKGS)

# About 8 minutes: it waits out SQS FIFO's deduplication window, which
# neither ElasticMQ nor moto can shorten (brokers/sqs/dedup_test.go), and
# runs the worker suite on moto (2 minutes, brokers/sqs/sqs_test.go).
test-long:
	$(SERVICES) up postgres sqs moto && eval "$$($(SERVICES) env postgres sqs moto)" && \
		FERRY_SQS_DEDUP_WINDOW_TEST=1 FERRY_SQS_MOTO_WORKER_SUITE=1 $(GO) test -count=1 -timeout 15m -run 'TestFIFODedup|TestWorkerSuiteMoto' -v ./brokers/sqs/

# The failover tests of internal/cluster with 15 s phases (about 25
# minutes). `make test` runs them too, with 2 s phases; each test starts its
# cluster (services.sh up rabbitmq-cluster, ...) and stops it at its end.
test-cluster:
	$(SERVICES) up postgres rabbitmq && eval "$$($(SERVICES) env postgres rabbitmq)" && \
		FERRY_CLUSTER_PHASE=15s $(GO) test -count=1 -timeout 60m -v -run 'TestFailover' ./internal/cluster/ | grep -E '^(=== RUN|---|PASS|FAIL|ok)|RESULT|kill|SIGSTOP|restart node|cluster up'; test $${PIPESTATUS[0]} = 0

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
	$(GO) build -o ferry ./cmd/ferry

vet:
	$(GO) vet ./...
