#!/usr/bin/env bash
# compare.sh - ferry and Watermill's outbox side by side, in one run:
# bench's BenchmarkEndToEnd/$BROKER and BenchmarkLatency/$BROKER against
# the peer in bench/watermill on the same broker (Watermill tuned and
# Watermill's defaults; its creation alone once, BenchmarkCreate),
# alternately, ROUNDS times each (default 2), on the servers of
# compose/local/services.sh. Prints every figure of every round and the
# ratios of each round, and keeps the raw benchmark output.
#
#   bench/compare.sh                 # from the repository root; RabbitMQ
#   BROKER=nats bench/compare.sh     # rabbitmq (default), kafka, nats or sqs
#   ROUNDS=1 FERRY_BENCH_EVENTS=5000 bench/compare.sh   # a quick look
#
# ferry's Go benchmarks measure the broker's CPU on RabbitMQ and NATS
# only; `ferry bench --scenarios peer` has it on all four.
#
# Any FERRY_BENCH_* variable (see bench/README.md) applies to both sides.
# Output: $OUT (default a fresh folder under /tmp): ferry-N.txt,
# watermill-N.txt, watermill-create-N.txt (raw), figures.tsv (round, side, benchmark, unit, value).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=${ROUNDS:-2}
BROKER=${BROKER:-rabbitmq}
case $BROKER in rabbitmq | kafka | nats | sqs) ;; *)
	echo "compare: BROKER=$BROKER: want rabbitmq, kafka, nats or sqs" >&2
	exit 2
	;;
esac
OUT=${OUT:-$(mktemp -d /tmp/ferry-compare.XXXXXX)}
mkdir -p "$OUT"

eval "$("$ROOT/compose/local/services.sh" env postgres "$BROKER")"
[ -n "${FERRY_DATABASE_URL:-}" ] ||
	{ echo "compare: start the servers first: compose/local/services.sh up postgres $BROKER" >&2; exit 1; }

# Build both once, so no compilation runs while the other side measures.
echo "compare: building the benchmarks (output in $OUT)" >&2
(cd "$ROOT" && go test -c -o "$OUT/ferry.test" ./bench/)
(cd "$ROOT/bench/watermill" && go test -c -o "$OUT/watermill.test" .)

run() { # SIDE ROUND DIR BINARY PATTERN
	local side=$1 round=$2 dir=$3 bin=$4 pattern=$5
	echo "compare: round $round: $side ($pattern)" >&2
	(cd "$dir" && "$bin" -test.run '^$' -test.bench "$pattern" -test.benchtime 1x -test.timeout 60m) >"$OUT/$side-$round.txt" 2>&1 ||
		{ echo "compare: $side failed, see $OUT/$side-$round.txt" >&2; tail -20 "$OUT/$side-$round.txt" >&2; exit 1; }
	# Benchmark lines: NAME-P  1  VALUE UNIT  VALUE UNIT ...
	awk -v r="$round" -v s="$side" '/^Benchmark/ && NF > 3 {
		name = $1; sub(/-[0-9]+$/, "", name)
		for (i = 3; i < NF; i += 2) printf "%s\t%s\t%s\t%s\t%s\n", r, s, name, $(i + 1), $i
	}' "$OUT/$side-$round.txt" >>"$OUT/figures.tsv"
}

: >"$OUT/figures.tsv"
for round in $(seq "$ROUNDS"); do
	run ferry "$round" "$ROOT/bench" "$OUT/ferry.test" "^Benchmark(EndToEnd|Latency)\$/^$BROKER\$"
	run watermill "$round" "$ROOT/bench/watermill" "$OUT/watermill.test" "^Benchmark(EndToEnd|Latency)\$/^$BROKER\$"
	run watermill-create "$round" "$ROOT/bench/watermill" "$OUT/watermill.test" '^BenchmarkCreate$'
done

# The figures, then the ratios of each round.
awk -F'\t' -v br="$BROKER" '
function v(r, b, u) { return ((r SUBSEP b SUBSEP u) in val) ? val[r, b, u] : "" }
function ratio(a, b) { return (a == "" || b == "" || b == 0) ? "n/a" : sprintf("%.2f", a / b) }
{ val[$1, $3, $4] = $5; if ($1 > rounds) rounds = $1 }
END {
	fe = "BenchmarkEndToEnd/" br; wt = fe "/tuned"; wd = fe "/defaults"; wc = "BenchmarkCreate"
	for (r = 1; r <= rounds; r++) {
		printf "\nround %d (%s)\n", r, br
		printf "%-22s %10s %10s %10s\n", "", "ferry", "wm tuned", "wm default"
		printf "%-22s %10s %10s %10s\n", "create-alone-events/s", v(r, fe, "create-alone-events/s"), v(r, wc, "create-alone-events/s"), v(r, wc, "create-alone-events/s")
		n = split("e2e-events/s app-cpu-s/1k postgres-cpu-s/1k " br "-cpu-s/1k all-cpu-s/1k wal-B/event commits/event walsyncs/event", us, " ")
		for (i = 1; i <= n; i++) printf "%-22s %10s %10s %10s\n", us[i], v(r, fe, us[i]), v(r, wt, us[i]), v(r, wd, us[i])
		split("200 1000", rates, " ")
		for (k = 1; k <= 2; k++) for (j = 1; j <= 2; j++) {
			u = (j == 1) ? "p50-ms" : "p99-ms"
			lb = "BenchmarkLatency/" br
			printf "%-22s %10s %10s %10s\n", u " @" rates[k] "/s", v(r, lb "/rate=" rates[k], u), v(r, lb "/tuned/rate=" rates[k], u), v(r, lb "/defaults/rate=" rates[k], u)
		}
		printf "ratios: ferry e2e / ferry creation alone %s (aim >= 0.7); ferry / watermill tuned: throughput %s (aim >= 2.5), CPU per event (all processes) %s (aim <= 0.5); ferry / watermill defaults: throughput %s, CPU %s\n",
			ratio(v(r, fe, "e2e-events/s"), v(r, fe, "create-alone-events/s")),
			ratio(v(r, fe, "e2e-events/s"), v(r, wt, "e2e-events/s")), ratio(v(r, fe, "all-cpu-s/1k"), v(r, wt, "all-cpu-s/1k")),
			ratio(v(r, fe, "e2e-events/s"), v(r, wd, "e2e-events/s")), ratio(v(r, fe, "all-cpu-s/1k"), v(r, wd, "all-cpu-s/1k"))
	}
}' "$OUT/figures.tsv"
echo "compare: raw output in $OUT" >&2
