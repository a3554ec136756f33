// Package runcost measures what a benchmark run cost the machine, in
// figures a noisy neighbour does not move much: the CPU time of each
// process involved (the benchmark's own process, the PostgreSQL server
// with all its backends, the broker), PostgreSQL's WAL bytes, commits and
// WAL fsyncs. Divided by the events the run moved, they give CPU seconds
// per 1,000 events and WAL bytes and commits per event.
//
// CPU comes from /proc (package procstat), so the servers must run on this
// machine and their /proc entries be readable (root, or the same user).
// WAL bytes are the distance between pg_current_wal_lsn() at Start and at
// Stop: exact, and for the whole cluster (a benchmark's own cluster, so
// its own writes). Commits and rollbacks are pg_stat_database's counters
// of the current database; WAL fsyncs are the cluster's, read where the
// server keeps them: pg_stat_wal.wal_sync up to PostgreSQL 17,
// pg_stat_io's fsyncs of object 'wal' from 18 on (18 dropped wal_sync).
// PostgreSQL's backends report those counters lazily (at most once a
// second, an idle one within 10 s, every one when it exits), so close the
// run's pools before Stop: Stop waits until their backends are gone.
package runcost

import (
	"context"

	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferrymq/ferry/internal/procstat"
)

// Process is one process tree whose CPU a Meter measures.
type Process struct {
	Name string // short name used in figures: "app", "postgres", "rabbitmq", "nats"
	PID  int    // the root of the tree (procstat.TreeCPU)
}

// Self is the calling process (a benchmark: its producers, relay and
// worker alike), named name.
func Self(name string) Process { return Process{Name: name, PID: os.Getpid()} }

// Postgres finds the PostgreSQL server behind pool: the parent (the
// postmaster) of the backend serving one of its connections. The server
// must run on this machine.
func Postgres(ctx context.Context, pool *pgxpool.Pool) (Process, error) {
	var backend int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return Process{}, fmt.Errorf("runcost: postgres backend pid: %w", err)
	}
	st, err := procstat.ReadStat(backend)
	if err != nil {
		return Process{}, fmt.Errorf("runcost: postgres backend %d (is the server on this machine?): %w", backend, err)
	}
	return Process{Name: "postgres", PID: st.PPID}, nil
}

// Listener finds the server listening on the port of rawURL (such as
// amqp://guest:guest@127.0.0.1:5672/ or nats://127.0.0.1:4222): a
// RabbitMQ node's beam.smp, a nats-server. name names it in figures.
func Listener(name, rawURL string) (Process, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return Process{}, fmt.Errorf("runcost: %s URL %q: %w", name, rawURL, err)
	}
	_, p, err := net.SplitHostPort(u.Host)
	if err != nil {
		return Process{}, fmt.Errorf("runcost: %s URL %q: no port: %w", name, rawURL, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return Process{}, fmt.Errorf("runcost: %s URL %q: port: %w", name, rawURL, err)
	}
	pid, err := procstat.ListenerPID(port)
	if err != nil {
		return Process{}, fmt.Errorf("runcost: %s: %w", name, err)
	}
	return Process{Name: name, PID: pid}, nil
}

// Meter is a measurement in progress, from Start to Stop.
type Meter struct {
	procs    []Process
	cpu      []time.Duration
	lsn      string
	version  int // server_version_num
	db       dbCounters
	started  time.Time
	database string
}

// dbCounters are PostgreSQL's cumulative counters Stop subtracts.
type dbCounters struct{ commits, rollbacks, walSyncs int64 }

// pg18 is server_version_num of PostgreSQL 18, which moved the WAL I/O
// counters (wal_write, wal_sync and their times) from pg_stat_wal to
// pg_stat_io's rows with object 'wal' (PostgreSQL 18 release notes,
// "Monitoring").
const pg18 = 180000

// walSyncsQuery returns the query of the cluster's WAL fsyncs so far on a
// server of version (server_version_num): pg_stat_wal.wal_sync before 18,
// the sum of pg_stat_io.fsyncs over the rows of object 'wal' from 18 on.
func walSyncsQuery(version int) string {
	if version >= pg18 {
		return `SELECT coalesce(sum(fsyncs), 0)::bigint FROM pg_stat_io WHERE object = 'wal'`
	}
	return `SELECT wal_sync FROM pg_stat_wal`
}

func readCounters(ctx context.Context, pool *pgxpool.Pool, version int) (dbCounters, error) {
	var c dbCounters
	err := pool.QueryRow(ctx, `
		SELECT xact_commit, xact_rollback FROM pg_stat_database
		WHERE datname = current_database()`).Scan(&c.commits, &c.rollbacks)
	if err != nil {
		return c, fmt.Errorf("runcost: read pg_stat_database: %w", err)
	}
	if err := pool.QueryRow(ctx, walSyncsQuery(version)).Scan(&c.walSyncs); err != nil {
		return c, fmt.Errorf("runcost: read the WAL fsyncs (server_version_num %d): %w", version, err)
	}
	return c, nil
}

func readCPU(procs []Process) ([]time.Duration, error) {
	out := make([]time.Duration, len(procs))
	for i, p := range procs {
		d, err := procstat.TreeCPU(p.PID)
		if err != nil {
			return nil, fmt.Errorf("runcost: CPU of %s (pid %d): %w", p.Name, p.PID, err)
		}
		out[i] = d
	}
	return out, nil
}

// Start samples the CPU of procs and PostgreSQL's counters through pool
// (a pool on the run's database).
func Start(ctx context.Context, pool *pgxpool.Pool, procs ...Process) (*Meter, error) {
	m := &Meter{procs: procs}
	var err error
	if err = pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text, current_database(), current_setting('server_version_num')::int`).Scan(&m.lsn, &m.database, &m.version); err != nil {
		return nil, fmt.Errorf("runcost: pg_current_wal_lsn: %w", err)
	}
	if m.db, err = readCounters(ctx, pool, m.version); err != nil {
		return nil, err
	}
	if m.cpu, err = readCPU(procs); err != nil {
		return nil, err
	}
	m.started = time.Now()
	return m, nil
}

// Stop samples again and returns the difference. CPU and WAL bytes are
// taken at once; then, for the counters backends report lazily, it waits
// (at most 15 s) until pool's own connections are the only client
// backends left on the database, so close the run's other pools first.
// If some stay, their unreported counters are missing and Cost.Lagging
// says how many backends were left.
func (m *Meter) Stop(ctx context.Context, pool *pgxpool.Pool) (Cost, error) {
	c := Cost{Elapsed: time.Since(m.started)}
	cpu, err := readCPU(m.procs)
	if err != nil {
		return c, err
	}
	for i, p := range m.procs {
		c.CPU = append(c.CPU, ProcessCPU{Name: p.Name, CPU: cpu[i] - m.cpu[i]})
	}
	if err := pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint`, m.lsn).Scan(&c.WALBytes); err != nil {
		return c, fmt.Errorf("runcost: WAL bytes: %w", err)
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var n int
		if err := pool.QueryRow(ctx, `
			SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND backend_type = 'client backend'`).Scan(&n); err != nil {
			return c, fmt.Errorf("runcost: pg_stat_activity: %w", err)
		}
		c.Lagging = max(n-int(pool.Stat().TotalConns()), 0)
		if c.Lagging == 0 || time.Now().After(deadline) {
			break
		}
	}
	end, err := readCounters(ctx, pool, m.version)
	if err != nil {
		return c, err
	}
	c.Commits = end.commits - m.db.commits
	c.Rollbacks = end.rollbacks - m.db.rollbacks
	c.WALSyncs = end.walSyncs - m.db.walSyncs
	return c, nil
}

// ProcessCPU is the CPU time one process tree used during a run.
type ProcessCPU struct {
	Name string
	CPU  time.Duration
}

// Cost is what a run cost, from Start to Stop.
type Cost struct {
	Elapsed   time.Duration
	CPU       []ProcessCPU // in the order given to Start
	WALBytes  int64        // WAL written by the cluster
	Commits   int64        // transactions committed in the database (read-only ones too)
	Rollbacks int64        // transactions rolled back in the database
	WALSyncs  int64        // WAL fsyncs of the cluster (pg_stat_wal.wal_sync; from PostgreSQL 18 pg_stat_io)
	// Lagging is how many client backends were still connected when
	// Stop read the counters (0 when every other pool was closed).
	Lagging int
}

// TotalCPU is the sum over the measured processes.
func (c Cost) TotalCPU() time.Duration {
	var t time.Duration
	for _, p := range c.CPU {
		t += p.CPU
	}
	return t
}

// Metric is one figure for testing.B.ReportMetric: value and unit (no
// spaces).
type Metric struct {
	Value float64
	Unit  string
}

// Metrics returns the per-event figures of a run that moved events
// events: CPU seconds per 1,000 events of each process and of all of them
// ("<name>-cpu-s/1k", "all-cpu-s/1k"), WAL bytes, commits and WAL fsyncs
// per event ("wal-B/event", "commits/event", "walsyncs/event").
func (c Cost) Metrics(events int) []Metric {
	k := float64(events) / 1000
	var out []Metric
	for _, p := range c.CPU {
		out = append(out, Metric{p.CPU.Seconds() / k, p.Name + "-cpu-s/1k"})
	}
	return append(out,
		Metric{c.TotalCPU().Seconds() / k, "all-cpu-s/1k"},
		Metric{float64(c.WALBytes) / float64(events), "wal-B/event"},
		Metric{float64(c.Commits) / float64(events), "commits/event"},
		Metric{float64(c.WALSyncs) / float64(events), "walsyncs/event"},
	)
}

// Describe says the figures of Metrics in words, with the totals.
func (c Cost) Describe(events int) string {
	k := float64(events) / 1000
	var parts []string
	for _, p := range c.CPU {
		parts = append(parts, fmt.Sprintf("%s %.3f", p.Name, p.CPU.Seconds()/k))
	}
	s := fmt.Sprintf("CPU s per 1,000 events: %s, all %.3f (%.1f CPU-s over %.1f s); per event: %.0f WAL bytes, %.2f commits, %.3f WAL fsyncs (%d rollbacks in all)",
		strings.Join(parts, ", "), c.TotalCPU().Seconds()/k, c.TotalCPU().Seconds(), c.Elapsed.Seconds(),
		float64(c.WALBytes)/float64(events), float64(c.Commits)/float64(events), float64(c.WALSyncs)/float64(events), c.Rollbacks)
	if c.Lagging > 0 {
		s += fmt.Sprintf("; %d backends still connected, their unreported commits missing", c.Lagging)
	}
	return s
}

// Statement is one normalized statement's figures from pg_stat_statements
// for one database.
type Statement struct {
	Query    string        // normalized text, whitespace collapsed
	Calls    int64         // executions
	Rows     int64         // rows returned or affected, in all
	Time     time.Duration // total execution time in the server
	WALBytes int64         // WAL the statement generated, in all
}

// Statements reads pg_stat_statements for the statements run on database
// dbName, most total time first, at most limit of them. admin is a pool
// on a database where the extension exists (compose/local/services.sh
// creates it in database ferry, with the library preloaded); its user sees
// the text of its own statements only. The view keeps counting across
// runs, so give each run a fresh database.
func Statements(ctx context.Context, admin *pgxpool.Pool, dbName string, limit int) ([]Statement, error) {
	rows, err := admin.Query(ctx, `
		SELECT regexp_replace(s.query, '\s+', ' ', 'g'), s.calls, s.rows,
		       s.total_exec_time, s.wal_bytes::bigint
		FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
		WHERE d.datname = $1
		ORDER BY s.total_exec_time DESC
		LIMIT $2`, dbName, limit)
	if err != nil {
		return nil, fmt.Errorf("runcost: pg_stat_statements (preloaded, extension created in this database?): %w", err)
	}
	defer rows.Close()
	var out []Statement
	for rows.Next() {
		var st Statement
		var ms float64
		if err := rows.Scan(&st.Query, &st.Calls, &st.Rows, &ms, &st.WALBytes); err != nil {
			return nil, fmt.Errorf("runcost: pg_stat_statements: %w", err)
		}
		st.Time = time.Duration(ms * float64(time.Millisecond))
		out = append(out, st)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("runcost: pg_stat_statements: %w", err)
	}
	return out, nil
}

// DescribeStatements gives one line per statement: calls, rows and WAL
// bytes per event, mean time per call, the query (cut at 110 bytes).
func DescribeStatements(sts []Statement, events int) []string {
	out := make([]string, 0, len(sts))
	for _, st := range sts {
		q := st.Query
		if len(q) > 110 {
			q = q[:110] + "..."
		}
		out = append(out, fmt.Sprintf("%7.3f calls/event %8.2f rows/call %7.1f WAL B/event %7.3f ms/call  %s",
			float64(st.Calls)/float64(events), float64(st.Rows)/float64(max(st.Calls, 1)),
			float64(st.WALBytes)/float64(events), st.Time.Seconds()*1000/float64(max(st.Calls, 1)), q))
	}
	return out
}

// Report hands each figure of Metrics(events) to report (a Go
// benchmark's b.ReportMetric), its unit prefixed by prefix (e.g.
// "create-"; "" for none), and returns Describe(events).
func (c Cost) Report(events int, prefix string, report func(value float64, unit string)) string {
	for _, mt := range c.Metrics(events) {
		report(mt.Value, prefix+mt.Unit)
	}
	return c.Describe(events)
}

// StatementsOf is Statements for the database pool is connected to, read
// through a short-lived pool on adminURL (a database where the extension
// exists), described per event by DescribeStatements: at most limit
// lines, most total time first. Errors: those of connecting, of reading
// the database's name and of Statements.
func StatementsOf(ctx context.Context, adminURL string, pool *pgxpool.Pool, events, limit int) ([]string, error) {
	admin, err := pgxpool.New(ctx, adminURL)
	if err != nil {
		return nil, fmt.Errorf("runcost: connect to the admin database: %w", err)
	}
	defer admin.Close()
	var name string
	if err := pool.QueryRow(ctx, `SELECT current_database()`).Scan(&name); err != nil {
		return nil, fmt.Errorf("runcost: current database: %w", err)
	}
	sts, err := Statements(ctx, admin, name, limit)
	if err != nil {
		return nil, err
	}
	return DescribeStatements(sts, events), nil
}
