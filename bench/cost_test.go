package bench

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/ferrymq/ferry/internal/runcost"
	"github.com/ferrymq/ferry/internal/testenv"
)

// startCost starts measuring what a run on db costs: the CPU of this
// process ("app": producers, relay and worker alike), of PostgreSQL and,
// unless kind is "", of the broker's server; PostgreSQL's WAL and commits.
func startCost(b *testing.B, db database, kind string) *runcost.Meter {
	b.Helper()
	ctx := benchCtx(b)
	pg, err := runcost.Postgres(ctx, db.pool)
	must(b, err)
	procs := []runcost.Process{runcost.Self("app"), pg}
	switch kind {
	case "rabbitmq":
		p, err := runcost.Listener("rabbitmq", testenv.RabbitMQURL())
		must(b, err)
		procs = append(procs, p)
	case "nats":
		p, err := runcost.Listener("nats", testenv.NATSURL())
		must(b, err)
		procs = append(procs, p)
	case "sqs", kindMoto:
		// ElasticMQ's java, moto's python: the server on the endpoint's
		// port, not a proxy in front of it.
		p, err := runcost.Listener(strings.TrimPrefix(kind, "sqs-"), sqsEndpoint(kind))
		must(b, err)
		if kind == "sqs" {
			p.Name = "elasticmq"
		}
		procs = append(procs, p)
	}
	m, err := runcost.Start(ctx, db.pool, procs...)
	must(b, err)
	return m
}

// stopCost ends the measurement (close the run's pools first), reports
// its per-event figures as metrics, each unit prefixed by prefix, and
// returns them in words.
func stopCost(b *testing.B, m *runcost.Meter, db database, events int, prefix string) string {
	b.Helper()
	c, err := m.Stop(benchCtx(b), db.pool)
	must(b, err)
	return c.Report(events, prefix, b.ReportMetric)
}

// logStatements logs, when FERRY_BENCH_STATEMENTS=1, the statements the
// run on db executed (pg_stat_statements), per event: what a relay and a
// worker cost PostgreSQL, statement by statement.
func logStatements(b *testing.B, db database, events int, label string) {
	b.Helper()
	if os.Getenv("FERRY_BENCH_STATEMENTS") != "1" {
		return
	}
	lines, err := runcost.StatementsOf(benchCtx(b), testenv.DatabaseURL(), db.pool, events, 25)
	must(b, err)
	// Printed, not logged: a benchmark's log is cut at 10 lines.
	fmt.Printf("%s: statements (pg_stat_statements, most total time first):\n\t%s\n", label, strings.Join(lines, "\n\t"))
}
