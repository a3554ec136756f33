package suite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// SoakRow is one row of the soak scenario: the relay's and the worker's
// processes and the outbox's tables at one moment, just before a fault
// (or at the start, or at the end).
type SoakRow struct {
	// Elapsed is the time since the producers started, in seconds.
	Elapsed float64 `json:"elapsed_s"`
	// Fault is the fault injected right after the row was read ("relay
	// SIGKILL", "worker SIGKILL", "broker restart"), "start" or "end";
	// a fault that failed has its error appended.
	Fault string `json:"fault"`
	// Relay and Worker are the child processes' figures.
	Relay  ProcessStats `json:"relay"`
	Worker ProcessStats `json:"worker"`
	// Unpublished is the outbox rows not yet published; OutboxRows all
	// of its rows and OutboxBytes its size with indexes and TOAST
	// (pg_total_relation_size).
	Unpublished int64 `json:"outbox_unpublished"`
	OutboxRows  int64 `json:"outbox_rows"`
	OutboxBytes int64 `json:"outbox_bytes"`
	// WALRetained is the WAL the replication slots hold, in bytes behind
	// the server's newest position (the largest of the slots of this
	// database and the physical ones; 0 without slots).
	WALRetained int64 `json:"wal_retained_bytes"`
	// Committed is the events committed so far (the business rows),
	// Handled those the worker marked sent, both read in one query.
	Committed int64 `json:"committed"`
	Handled   int64 `json:"handled"`
	// Lost is the events committed more than the overdue time (a fault
	// interval, at least a minute) ago and still not handled; at the end,
	// after the drain, every event not handled.
	Lost int64 `json:"lost"`
	// Twice is the business rows the handler ran on more than once: an
	// effect applied twice.
	Twice int64 `json:"effects_applied_twice"`
	// Absorbed is the redelivered copies the worker's dedup dropped.
	Absorbed int64 `json:"duplicates_absorbed"`
}

// ProcessStats are one child process's figures; zero when it could not
// be read (the process just started and has not reported yet).
type ProcessStats struct {
	PID int `json:"pid"`
	// HeapInuse (bytes) and Goroutines are the child's own report
	// (ChildStats).
	HeapInuse  uint64 `json:"heap_inuse_bytes"`
	Goroutines int    `json:"goroutines"`
	// OpenFiles is the entries of /proc/PID/fd; RSS is VmRSS in bytes.
	OpenFiles int   `json:"open_files"`
	RSS       int64 `json:"rss_bytes"`
}

// processStats reads the figures of the child c, whose stats file is
// path.
func processStats(c *child, path string) ProcessStats {
	pid := c.cmd.Process.Pid
	ps := ProcessStats{PID: pid, RSS: rss(pid)}
	if st, ok := readStats(path, pid); ok {
		ps.HeapInuse, ps.Goroutines = st.HeapInuse, st.Goroutines
	}
	if fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
		ps.OpenFiles = len(fds)
	}
	return ps
}

// soakSeries are the series whose flatness the soak judges: a name, the
// value of a row, and the growth under which it counts as flat whatever
// the ratio (the noise of a small figure).
var soakSeries = []struct {
	name  string
	value func(SoakRow) float64
	floor float64
	// grows says why the series grows by design; empty: it should not.
	grows string
}{
	{"relay heap", func(r SoakRow) float64 { return float64(r.Relay.HeapInuse) }, 4 << 20, ""},
	{"relay goroutines", func(r SoakRow) float64 { return float64(r.Relay.Goroutines) }, 10, ""},
	{"relay open files", func(r SoakRow) float64 { return float64(r.Relay.OpenFiles) }, 5, ""},
	{"relay RSS", func(r SoakRow) float64 { return float64(r.Relay.RSS) }, 8 << 20, ""},
	{"worker heap", func(r SoakRow) float64 { return float64(r.Worker.HeapInuse) }, 4 << 20, ""},
	{"worker goroutines", func(r SoakRow) float64 { return float64(r.Worker.Goroutines) }, 10, ""},
	{"worker open files", func(r SoakRow) float64 { return float64(r.Worker.OpenFiles) }, 5, ""},
	{"worker RSS", func(r SoakRow) float64 { return float64(r.Worker.RSS) }, 8 << 20, ""},
	{"outbox unpublished", func(r SoakRow) float64 { return float64(r.Unpublished) }, 0, ""},
	{"outbox rows", func(r SoakRow) float64 { return float64(r.OutboxRows) }, 0, "the bench relay keeps published rows (Retention -1; a real relay keeps them an hour at least)"},
	{"outbox bytes", func(r SoakRow) float64 { return float64(r.OutboxBytes) }, 0, "as outbox rows"},
	{"WAL retained", func(r SoakRow) float64 { return float64(r.WALRetained) }, 16 << 20, ""},
}

// SoakFlatness is one series of the soak judged for flatness: the
// largest value of the last third of the rows against the largest of the
// first third.
type SoakFlatness struct {
	Series string  `json:"series"`
	First  float64 `json:"first_third_max"`
	Last   float64 `json:"last_third_max"`
	// Ratio is Last/First (0 when First is 0).
	Ratio float64 `json:"ratio"`
	// Flat: Ratio at most 1.5, or a growth within the series' noise.
	Flat bool `json:"flat"`
	// Grows, when set, says why the series grows by design.
	Grows string `json:"grows,omitempty"`
}

// soakFlatness judges every soakSeries over rows (at least 3, else nil):
// the rows after the start, whose figures are those of children that
// have not worked yet.
func soakFlatness(rows []SoakRow) []SoakFlatness {
	if len(rows) < 3 {
		return nil
	}
	third := len(rows) / 3
	first, last := rows[:third], rows[len(rows)-third:]
	maxOf := func(rs []SoakRow, v func(SoakRow) float64) float64 {
		m := 0.0
		for _, r := range rs {
			m = max(m, v(r))
		}
		return m
	}
	// The noise floor of the unpublished rows: a second of production,
	// the committed events of the run per second.
	perSecond := 0.0
	if e := rows[len(rows)-1].Elapsed; e > 0 {
		perSecond = float64(rows[len(rows)-1].Committed) / e
	}
	out := make([]SoakFlatness, 0, len(soakSeries))
	for _, s := range soakSeries {
		f := SoakFlatness{Series: s.name, First: maxOf(first, s.value), Last: maxOf(last, s.value), Grows: s.grows}
		if f.First > 0 {
			f.Ratio = f.Last / f.First
		}
		floor := s.floor
		if s.name == "outbox unpublished" {
			floor = max(perSecond, 10)
		}
		f.Flat = f.Last <= f.First*1.5 || f.Last-f.First <= floor
		out = append(out, f)
	}
	return out
}

// soakHeader and formatSoakRow print the rows as a fixed-width table.
const soakHeader = "elapsed  fault             | relay heap  gor  fds      rss | worker heap  gor  fds      rss | unpublished  outbox rows    outbox size  WAL retained | committed   handled  lost  twice  absorbed"

func formatSoakRow(r SoakRow) string {
	p := func(ps ProcessStats) string {
		return fmt.Sprintf("%10s %4d %4d %8s", bytesIEC(float64(ps.HeapInuse)), ps.Goroutines, ps.OpenFiles, bytesIEC(float64(ps.RSS)))
	}
	return fmt.Sprintf("%7s  %-17s | %s | %s  | %11d %12d %14s %13s | %9d %9d %5d %6d %9d",
		FormatSeconds(r.Elapsed), r.Fault, p(r.Relay), p(r.Worker), r.Unpublished, r.OutboxRows, bytesIEC(float64(r.OutboxBytes)), bytesIEC(float64(r.WALRetained)),
		r.Committed, r.Handled, r.Lost, r.Twice, r.Absorbed)
}

// bytesIEC formats bytes as KiB, MiB or GiB.
func bytesIEC(b float64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2f GiB", b/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.0f KiB", b/(1<<10))
	}
	return fmt.Sprintf("%.0f B", b)
}

// soak: producers commit at Rate (200/s by default) for SoakDuration
// while the relay and the worker run as child processes; every
// SoakFaultEvery one fault, cycling through a SIGKILL of the relay, a
// SIGKILL of the worker and a broker restart (RestartBroker, when set).
// At the start, before each fault and at the end one row (SoakRow) is
// printed; at the end, after the drain, whether each series stayed flat.
// Any lost event or effect applied twice fails the run.
func (r *runner) soak(ctx context.Context, t Target) ([]Result, error) {
	if r.cfg.Spawn == nil {
		return []Result{{Status: statusUnsupported, Note: "needs the ferry binary to run the relay and the worker as child processes"}}, nil
	}
	rt := r.cfg.Rate
	if rt == 0 {
		rt = 200
	}
	every, dur := r.cfg.SoakFaultEvery, r.cfg.SoakDuration
	overdue := max(every, time.Minute)
	db, tp, err := r.childRun(ctx, t)
	if err != nil {
		return nil, err
	}
	defer db.close()
	defer r.cleanup(t, tp)
	statsDir, err := os.MkdirTemp("", "ferry-soak-")
	if err != nil {
		return nil, fmt.Errorf("bench: soak stats folder: %w", err)
	}
	defer os.RemoveAll(statsDir)
	statsFile := func(role string) string { return filepath.Join(statsDir, role+".json") }
	children := map[string]*child{}
	spawn := func(role string) error {
		c, err := r.spawnAs(ctx, ScenarioSoak, t, role, db.url, tp.Exchange, "--stats-file", statsFile(role))
		if err != nil {
			return err
		}
		children[role] = c
		return nil
	}
	for _, role := range []string{RoleRelay, RoleWorker} {
		if err := spawn(role); err != nil {
			return nil, err
		}
	}
	defer func() {
		for _, c := range children {
			c.stop()
		}
	}()
	pool, err := db.pool(ctx, producers)
	if err != nil {
		return nil, err
	}
	defer pool.Close()

	// reported waits, at most 30 s, for both children's first report: a
	// child started just before a row has not written its figures yet.
	reported := func() {
		_ = waitFor(ctx, 30*time.Second, func() bool {
			for role, c := range children {
				if _, ok := readStats(statsFile(role), c.cmd.Process.Pid); !ok {
					return false
				}
			}
			return true
		}, nil)
	}
	reported()

	start := time.Now()
	pctx, stopProducing := context.WithCancel(ctx)
	defer stopProducing()
	prodErr := make(chan error, 1)
	go func() {
		_, err := produceAll(pctx, pool, 1<<30, producers, rt, r.cfg.Size, nil)
		if pctx.Err() != nil {
			err = nil
		}
		prodErr <- err
	}()

	var rows []SoakRow
	read := func(fault string) (SoakRow, error) {
		reported()
		row := SoakRow{Elapsed: time.Since(start).Seconds(), Fault: fault,
			Relay: processStats(children[RoleRelay], statsFile(RoleRelay)), Worker: processStats(children[RoleWorker], statsFile(RoleWorker))}
		err := db.admin.QueryRow(ctx, `
			SELECT count(*) FILTER (WHERE processed_at IS NULL), count(*), pg_total_relation_size('outbox') FROM outbox`).
			Scan(&row.Unpublished, &row.OutboxRows, &row.OutboxBytes)
		if err == nil {
			err = db.admin.QueryRow(ctx, `
				SELECT coalesce(max(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)), 0)::bigint
				FROM pg_replication_slots
				WHERE restart_lsn IS NOT NULL AND (database = current_database() OR slot_type = 'physical')`).Scan(&row.WALRetained)
		}
		if err == nil {
			err = db.admin.QueryRow(ctx, `
				SELECT count(*), count(*) FILTER (WHERE status = 'sent'),
				       count(*) FILTER (WHERE status <> 'sent' AND created_at < now() - make_interval(secs => $1)),
				       count(*) FILTER (WHERE attempts > 1)
				FROM notifications`, overdue.Seconds()).Scan(&row.Committed, &row.Handled, &row.Lost, &row.Twice)
		}
		if err == nil {
			err = db.admin.QueryRow(ctx, `SELECT count(*) FROM bench_duplicates`).Scan(&row.Absorbed)
		}
		if err != nil {
			return row, fmt.Errorf("bench: soak row: %w", err)
		}
		return row, nil
	}
	emit := func(row SoakRow) {
		rows = append(rows, row)
		fmt.Fprintf(r.cfg.Progress, "soak %s: %s\n", t.Name, formatSoakRow(row))
	}
	fmt.Fprintf(r.cfg.Progress, "soak %s: %d events/s for %s, a fault every %s; overdue (lost so far) after %s\n",
		t.Name, rt, FormatSeconds(dur.Seconds()), FormatSeconds(every.Seconds()), FormatSeconds(overdue.Seconds()))
	fmt.Fprintf(r.cfg.Progress, "soak %s: %s\n", t.Name, soakHeader)
	row, err := read("start")
	if err != nil {
		return nil, err
	}
	emit(row)

	type step struct {
		name string
		do   func() error
	}
	restart := func(role string) func() error {
		return func() error {
			children[role].kill()
			return spawn(role)
		}
	}
	steps := []step{{"relay SIGKILL", restart(RoleRelay)}, {"worker SIGKILL", restart(RoleWorker)}}
	if r.cfg.RestartBroker != nil {
		steps = append(steps, step{"broker restart", func() error { return r.cfg.RestartBroker(ctx, t.Name) }})
	}
	var failedFaults []string
	for k := 1; ; k++ {
		next := start.Add(time.Duration(k) * every)
		if !next.Before(start.Add(dur)) {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case err := <-prodErr:
			return nil, fmt.Errorf("bench: soak producers: %w", err)
		case <-time.After(time.Until(next)):
		}
		st := steps[(k-1)%len(steps)]
		row, err := read(st.name)
		if err != nil {
			return nil, err
		}
		if ferr := st.do(); ferr != nil {
			row.Fault += " FAILED: " + ferr.Error()
			failedFaults = append(failedFaults, fmt.Sprintf("%s at %s: %v", st.name, FormatSeconds(row.Elapsed), ferr))
		}
		emit(row)
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case err := <-prodErr:
		return nil, fmt.Errorf("bench: soak producers: %w", err)
	case <-time.After(time.Until(start.Add(dur))):
	}
	if row, err = read("end"); err != nil {
		return nil, err
	}
	emit(row)
	stopProducing()
	if perr := <-prodErr; perr != nil {
		return nil, perr
	}

	// The drain: every committed event handled, at most two minutes. A
	// commit cut short by the stop may still land after the producers
	// returned, so the final row, whose committed and handled are one
	// query's, is read until it shows the drain too.
	drainBy := time.Now().Add(2 * time.Minute)
	var final SoakRow
	for {
		_ = waitFor(ctx, time.Until(drainBy), func() bool {
			var total, sent int64
			err := db.admin.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'sent') FROM notifications`).Scan(&total, &sent)
			return err == nil && sent >= total
		}, nil)
		if final, err = read("drained"); err != nil {
			return nil, err
		}
		if final.Handled >= final.Committed || !time.Now().Before(drainBy) {
			break
		}
	}
	total := final.Committed
	final.Lost = final.Committed - final.Handled
	elapsed := time.Since(start)

	out := Result{Messages: int(total), Seconds: elapsed.Seconds(), Soak: append(rows, final),
		Variant: fmt.Sprintf("%s at %d/s, a fault every %s", FormatSeconds(dur.Seconds()), rt, FormatSeconds(every.Seconds()))}
	out.add("lost", float64(final.Lost), "")
	out.add("effects applied twice", float64(final.Twice), "")
	out.add("duplicates absorbed", float64(final.Absorbed), "")
	out.add("faults", float64(len(rows)-2), "")
	flat := soakFlatness(rows[1:])
	fmt.Fprintf(r.cfg.Progress, "soak %s: after the drain (%s): committed %d, handled %d, lost %d, effects applied twice %d, duplicates absorbed %d\n",
		t.Name, FormatSeconds(elapsed.Seconds()), total, final.Handled, final.Lost, final.Twice, final.Absorbed)
	if flat == nil {
		fmt.Fprintf(r.cfg.Progress, "soak %s: flatness: fewer than 3 rows, not judged\n", t.Name)
	} else {
		fmt.Fprintf(r.cfg.Progress, "soak %s: flatness, the last third's max against the first third's (of the %d rows after the start; flat: at most 1.5 times, or within the noise):\n", t.Name, len(rows)-1)
	}
	var grew []string
	for _, f := range flat {
		verdict := "FLAT"
		if !f.Flat {
			verdict = "GREW"
			if f.Grows == "" {
				grew = append(grew, f.Series)
			}
		}
		ratio := "-"
		if f.First > 0 {
			ratio = fmt.Sprintf("%.2f", f.Ratio)
		}
		v := func(x float64) string {
			if strings.Contains(f.Series, "heap") || strings.Contains(f.Series, "RSS") || strings.Contains(f.Series, "bytes") || strings.Contains(f.Series, "WAL") {
				return bytesIEC(x)
			}
			return fmt.Sprintf("%.0f", x)
		}
		line := fmt.Sprintf("soak %s:   %-19s %-4s  ratio %5s  (%s -> %s)", t.Name, f.Series, verdict, ratio, v(f.First), v(f.Last))
		if f.Grows != "" {
			line += "; grows by design: " + f.Grows
		}
		fmt.Fprintln(r.cfg.Progress, line)
		name := f.Series + " growth"
		out.add(name, f.Ratio, "x")
	}
	note := fmt.Sprintf("%d events at %d/s over %s, %d faults (cycle: relay SIGKILL, worker SIGKILL", total, rt, FormatSeconds(dur.Seconds()), len(rows)-2)
	if r.cfg.RestartBroker != nil {
		note += ", broker restart)"
	} else {
		note += "; no broker restart: --restart-broker none, or no way to restart this broker)"
	}
	if flat != nil {
		if len(grew) == 0 {
			note += "; every series flat but the outbox's kept rows"
		} else {
			note += "; grew: " + strings.Join(grew, ", ")
		}
	}
	if len(failedFaults) > 0 {
		note += "; faults that failed: " + strings.Join(failedFaults, "; ")
	}
	out.Note = note
	if final.Lost > 0 || final.Twice > 0 {
		out.Status = statusFailed
		out.Note = fmt.Sprintf("%d lost, %d effects applied twice: %s", final.Lost, final.Twice, out.Note)
	}
	return []Result{out}, nil
}
