package ferrycli

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ferrymq/ferry/app"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/console"
	"github.com/ferrymq/ferry/dlq"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

// sampleNDJSON is demo's built-in input: 50 valid notification requests in
// several languages and 5 invalid ones (missing and malformed address,
// unknown channel, empty body, a number where a string belongs).
//
//go:embed sample.ndjson
var sampleNDJSON []byte

// demoBrokerWait is how long the demo waits for an unreachable broker
// (connection refused, timeouts, DNS failures) before it fails with the
// broker's last error. A refused login or a malformed flag fails at once.
const demoBrokerWait = 10 * time.Second

const (
	flagFile    = "file"
	flagTimeout = "timeout"
	flagClients = "clients"
)

func demoCommand() *cli.Command {
	return &cli.Command{
		Name:  "demo",
		Usage: "run api, relay and worker, post every line of --file (or a built-in sample) to the API, wait until each accepted notification is sent or dead, and print a summary",
		Description: "Without --database-url, --broker/--nats-url and --smtp-addr, demo starts embedded PostgreSQL,\n" +
			"NATS JetStream and an SMTP sink in its own process. Its API accepts nothing before the\n" +
			"topology is declared on the broker; a broker it cannot reach stops it after 10s with the\n" +
			"broker's last error. It exits 0 only when every accepted notification reached a final\n" +
			"state (sent or dead).",
		Flags: concat(databaseFlags(true), brokerFlags(true, declareQueueType), brokerLimitFlags(true), topologyFlags(), destinationFlags(), relayFlags(), workerFlags(), smtpFlags(true), shutdownFlags(), dataDirFlags(), logFlags("warn"), consoleFlags(true), []cli.Flag{
			&cli.BoolFlag{Name: flagConsoleHold, EnvVars: env("demo-console-hold"), Category: catConsole, Usage: "after the summary, keep the servers and the console running until interrupted (Ctrl-C)"},
			&cli.StringFlag{Name: flagFile, Aliases: []string{"f"}, EnvVars: env("demo-file"), Usage: "NDJSON file, one POST /notifications body a line (default: a built-in sample of 55 lines)"},
			&cli.DurationFlag{Name: flagTimeout, Value: 10 * time.Minute, EnvVars: env("demo-timeout"), Usage: "give up when not every notification reached a final state by then"},
			&cli.IntFlag{Name: flagClients, Value: 8, EnvVars: env("demo-clients"), Usage: "concurrent HTTP clients posting the lines"},
		}),
		Action: runDemo,
	}
}

// readLines returns the non-blank lines of the demo input.
func readLines(path string) (lines [][]byte, name string, err error) {
	data, name := sampleNDJSON, "built-in sample"
	if path != "" {
		data, err = os.ReadFile(path)
		if err != nil {
			return nil, "", usagef("--%s: %v", flagFile, err)
		}
		name = path
	}
	for _, l := range bytes.Split(data, []byte("\n")) {
		l = bytes.TrimSuffix(l, []byte("\r"))
		if len(bytes.TrimSpace(l)) > 0 {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		return nil, "", usagef("--%s %s: no lines to post", flagFile, path)
	}
	return lines, name, nil
}

// demoResult collects what the posting clients saw.
type demoResult struct {
	mu       sync.Mutex
	posted   int
	accepted []int64
	rejected map[string]int
}

func (r *demoResult) counts() (posted, accepted, rejected int, ids []int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, v := range r.rejected {
		n += v
	}
	return r.posted, len(r.accepted), n, append([]int64(nil), r.accepted...)
}

func runDemo(c *cli.Context) error {
	s, log, err := setup(c, "warn")
	if err != nil {
		return err
	}
	// Per-message warnings (968 dead letters are 968 WARN lines) are
	// counted for the summary instead of printed, unless --log-level asks
	// for the log as it is.
	var quiet *quietHandler
	if !c.IsSet(flagLogLevel) {
		quiet = newQuietHandler(log.Handler())
		log = slog.New(quiet)
	}
	if n := c.Int(flagClients); n < 1 {
		return usagef("--%s %d: must be at least 1", flagClients, n)
	}
	if d := c.Duration(flagTimeout); d <= 0 {
		return usagef("--%s %v: must be positive", flagTimeout, d)
	}
	lines, inputName, err := readLines(c.String(flagFile))
	if err != nil {
		return err
	}
	if err := checkBrokerFlags(c, s, true); err != nil {
		return err
	}
	out := c.App.Writer
	ctx := c.Context

	var stops stopper
	defer stops.stop()
	fmt.Fprintln(out, "ferry demo: starting servers…")
	w, err := startEmbedded(ctx, s, log, &stops)
	if err != nil {
		return err
	}
	s.addr = "127.0.0.1:0"
	st, err := openStack(ctx, s, log, true)
	if err != nil {
		return err
	}
	defer st.close()
	var duplicates atomic.Int64
	st.onOutcome = func(_ *broker.Message, o worker.Outcome, _ time.Duration) {
		if o == worker.OutcomeDuplicate {
			duplicates.Add(1)
		}
	}
	ready := make(chan string, 1)
	st.apiReady = func(addr string) { ready <- addr }
	// The API starts only once the relay and the worker declared the
	// topology: a broker that refuses it (a queue of another type, other
	// retry delays) stops the demo before anything is accepted.
	st.apiAfterBroker = true
	// A broker that stays unreachable fails the demo within seconds, with
	// its own words, instead of after the whole --timeout.
	st.brokerGiveUp = demoBrokerWait
	res := &demoResult{rejected: map[string]int{}}
	consoleURL := make(chan string, 1)
	if st.console = loadConsoleOpts(c); st.console != nil {
		st.console.ready = func(url string) { consoleURL <- url }
		st.console.figures = demoFigures(st, res)
	}
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	runErr := make(chan error, 1)
	go func() { runErr <- st.runAll(runCtx) }()

	fmt.Fprintf(out, "ferry demo: database: %s\nferry demo: broker:   %s\nferry demo: relay:    %s\nferry demo: mail:     %s\nferry demo: declaring the topology on the broker…\n",
		w.database, w.broker, relayModeText(s), w.smtp)
	deadline := time.After(c.Duration(flagTimeout))
	var apiAddr string
	select {
	case apiAddr = <-ready:
	case err := <-runErr:
		if err == nil {
			err = errors.New("stopped without an error")
		}
		return fmt.Errorf("ferry demo: stopped before the API started, nothing was posted: %w", err)
	case <-deadline:
		return fmt.Errorf("ferry demo: the broker (%s) was not ready within --%s %v, nothing was posted", w.broker, flagTimeout, c.Duration(flagTimeout))
	case <-ctx.Done():
		return nil
	}
	if st.console != nil {
		select {
		case url := <-consoleURL:
			fmt.Fprintf(out, "ferry demo: console:  %s\n", url)
		case <-time.After(5 * time.Second):
			fmt.Fprintln(out, "ferry demo: console:  not listening yet (see the log)")
		}
	}
	fmt.Fprintf(out, "ferry demo: posting %d line(s) of %s to http://%s/notifications\n", len(lines), inputName, apiAddr)

	start := time.Now()
	postDone := make(chan struct{})
	postCtx, stopPosting := context.WithCancel(runCtx)
	defer stopPosting()
	keyPrefix := fmt.Sprintf("ferry-demo-%d-", start.UnixNano())
	go func() {
		defer close(postDone)
		postAll(postCtx, "http://"+apiAddr+"/notifications", keyPrefix, lines, c.Int(flagClients), res)
	}()

	bar := newProgress(out, start)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var cnt demoCounts
	var ids []int64
	posting := true
	var failure error
loop:
	for {
		select {
		case <-postDone:
			posting, postDone = false, nil
		case <-tick.C:
		case err := <-runErr:
			if err == nil {
				err = errors.New("stopped without an error")
			}
			failure = fmt.Errorf("ferry demo: api, relay or worker stopped early: %w", err)
			runErr = nil
			break loop
		case <-deadline:
			failure = fmt.Errorf("ferry demo: not every accepted notification reached a final state within --%s %v", flagTimeout, c.Duration(flagTimeout))
			break loop
		case <-ctx.Done():
			failure = errors.New("ferry demo: interrupted before every accepted notification reached a final state")
			break loop
		}
		cnt.lines = len(lines)
		cnt.posted, cnt.accepted, cnt.rejected, ids = res.counts()
		if err := countFinal(ctx, st, ids, &cnt); err != nil {
			if ctx.Err() == nil {
				log.Warn("demo: reading notification statuses", "error", err)
			}
			continue
		}
		bar.update(cnt)
		if !posting && cnt.sent+cnt.dead == cnt.accepted {
			break
		}
	}

	// Count again after the posting clients stopped: on an early stop the
	// last counts are stale, and a POST still in flight gets its answer
	// (the API drains its requests when it stops), so every accepted
	// notification is in the summary.
	stopPosting()
	if postDone != nil {
		<-postDone
	}
	cnt.lines = len(lines)
	cnt.posted, cnt.accepted, cnt.rejected, ids = res.counts()
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	if err := countFinal(qctx, st, ids, &cnt); err != nil {
		log.Warn("demo: reading notification statuses", "error", err)
	}
	bar.finish(cnt)

	sum := summary{
		input: inputName, lines: len(lines), counts: cnt, rejected: res.rejected,
		where:       w,
		retryDelays: s.retryDelays, maxAttempts: s.maxAttempts,
		relayMode: relayModeText(s), quiet: quiet,
	}
	sum.p50, sum.p99, sum.deadReasons, _ = latencyAndReasons(qctx, st, ids)
	if sum.first, sum.last, err = finalSpan(qctx, st, ids); err != nil {
		log.Warn("demo: reading the notifications' timestamps", "error", err)
	}
	if cnt.accepted > cnt.sent+cnt.dead {
		var err error
		if sum.pending, err = pendingNotifications(qctx, st, ids, maxPendingListed); err != nil {
			log.Warn("demo: listing the pending notifications", "error", err)
		}
	}
	cancel()

	if c.Bool(flagConsoleHold) && st.console != nil && ctx.Err() == nil {
		if failure == nil {
			failure = sum.nothingSent()
		}
		sum.print(out, failure)
		fmt.Fprintln(out, "ferry demo: the console keeps running (--console-hold); Ctrl-C stops it")
		select {
		case <-ctx.Done():
		case err := <-runErr:
			runErr = nil
			if err != nil && failure == nil {
				failure = fmt.Errorf("ferry demo: api, relay or worker stopped: %w", err)
			}
		}
		stopRun()
		if runErr != nil {
			if err := <-runErr; err != nil && failure == nil {
				failure = fmt.Errorf("ferry demo: shutdown: %w", err)
			}
		}
		return failure
	}
	stopRun()
	if runErr != nil {
		if err := <-runErr; err != nil && failure == nil {
			failure = fmt.Errorf("ferry demo: shutdown: %w", err)
		}
	}
	sum.duplicates = duplicates.Load() // after the worker stopped
	if failure == nil {
		failure = sum.nothingSent()
	}
	sum.print(out, failure)
	return failure
}

// postAll posts every line with n concurrent clients and records the
// answers in res. Line i carries Idempotency-Key keyPrefix+i, so a POST
// retried after a lost answer cannot create a second notification.
// Cancelling ctx stops handing out lines; a POST already sent still gets
// its answer, so an accepted line is never counted as failed.
func postAll(ctx context.Context, url, keyPrefix string, lines [][]byte, n int, res *demoResult) {
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	defer client.CloseIdleConnections()
	type job struct {
		line []byte
		key  string
	}
	work := make(chan job)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for j := range work {
				id, reason := postOne(ctx, client, url, j.key, j.line)
				res.mu.Lock()
				res.posted++
				if reason == "" {
					res.accepted = append(res.accepted, id)
				} else {
					res.rejected[reason]++
				}
				res.mu.Unlock()
			}
		})
	}
	for i, l := range lines {
		select {
		case work <- job{line: l, key: keyPrefix + strconv.Itoa(i+1)}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(work)
	wg.Wait()
}

// postOne posts one line with Idempotency-Key key and returns the new
// notification's id, or the reason it was refused (the API's error code
// and field). It retries a request that got no answer at most twice, not
// after ctx is done; a request once sent is not cancelled by ctx.
func postOne(ctx context.Context, client *http.Client, url, key string, line []byte) (int64, string) {
	var lastErr error
	for try := 0; try < 3; try++ {
		req, err := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodPost, url, bytes.NewReader(line))
		if err != nil {
			return 0, "request: " + err.Error()
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			lastErr = err
			if ctx.Err() != nil {
				break
			}
			time.Sleep(200 * time.Millisecond)
			continue
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if resp.StatusCode == http.StatusCreated {
			var created app.Created
			if err := json.Unmarshal(body, &created); err != nil {
				return 0, "unreadable 201 answer"
			}
			id, err := strconv.ParseInt(created.ID, 10, 64)
			if err != nil {
				return 0, "unreadable 201 answer"
			}
			return id, ""
		}
		var apiErr app.APIError
		if json.Unmarshal(body, &apiErr) == nil && apiErr.Code != "" {
			if apiErr.Field != "" {
				return 0, fmt.Sprintf("%s (%s)", apiErr.Code, apiErr.Field)
			}
			return 0, apiErr.Code
		}
		return 0, fmt.Sprintf("HTTP %d", resp.StatusCode)
	}
	return 0, "request failed: " + errString(lastErr)
}

func errString(err error) string {
	if err == nil {
		return "cancelled"
	}
	return err.Error()
}

// countFinal reads how many of ids are sent and dead.
func countFinal(ctx context.Context, st *stack, ids []int64, c *demoCounts) error {
	if len(ids) == 0 {
		c.sent, c.dead = 0, 0
		return nil
	}
	return st.pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE status = 'sent'), count(*) FILTER (WHERE status = 'dead')
		FROM notifications WHERE id = ANY($1)`, ids).Scan(&c.sent, &c.dead)
}

// latencyAndReasons returns p50 and p99 of created_at → sent_at over the
// sent notifications of ids, and the last errors of the dead ones with
// their counts.
func latencyAndReasons(ctx context.Context, st *stack, ids []int64) (p50, p99 time.Duration, reasons map[string]int, err error) {
	if len(ids) == 0 {
		return 0, 0, nil, nil
	}
	var a, b *float64
	err = st.pool.QueryRow(ctx, `
		SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM sent_at - created_at)),
		       percentile_cont(0.99) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM sent_at - created_at))
		FROM notifications WHERE id = ANY($1) AND status = 'sent' AND sent_at IS NOT NULL`, ids).Scan(&a, &b)
	if err != nil {
		return 0, 0, nil, err
	}
	if a != nil && b != nil {
		p50, p99 = time.Duration(*a*float64(time.Second)), time.Duration(*b*float64(time.Second))
	}
	rows, err := st.pool.Query(ctx, `
		SELECT COALESCE(last_error, '') FROM notifications
		WHERE id = ANY($1) AND status = 'dead'`, ids)
	if err != nil {
		return p50, p99, nil, err
	}
	defer rows.Close()
	reasons = map[string]int{}
	for rows.Next() {
		var r string
		if err := rows.Scan(&r); err != nil {
			return p50, p99, reasons, err
		}
		reasons[dlq.Cause(r)]++
	}
	return p50, p99, reasons, rows.Err()
}

// maxPendingListed bounds the notifications the summary lists as still
// pending; it counts the rest.
const maxPendingListed = 20

// pendingNotification is one notification the demo left neither sent nor
// dead.
type pendingNotification struct {
	id        int64
	status    string
	attempts  int
	lastError string
}

// pendingNotifications returns the first limit of ids (by id) that are
// neither sent nor dead.
func pendingNotifications(ctx context.Context, st *stack, ids []int64, limit int) ([]pendingNotification, error) {
	rows, err := st.pool.Query(ctx, `
		SELECT id, status, attempts, COALESCE(last_error, '') FROM notifications
		WHERE id = ANY($1) AND status NOT IN ('sent', 'dead') ORDER BY id LIMIT $2`, ids, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []pendingNotification
	for rows.Next() {
		var n pendingNotification
		if err := rows.Scan(&n.id, &n.status, &n.attempts, &n.lastError); err != nil {
			return out, err
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

// summary is what the demo prints at the end.
type summary struct {
	input       string
	lines       int
	counts      demoCounts
	rejected    map[string]int
	duplicates  int64
	p50, p99    time.Duration
	deadReasons map[string]int
	pending     []pendingNotification // the first maxPendingListed still pending
	where       *where
	retryDelays []time.Duration
	maxAttempts int
	relayMode   string
	quiet       *quietHandler // nil when --log-level was given
	// first and last are the database's times of the first notification
	// created and the last one to reach a final state (sent_at, or
	// updated_at of a dead one); zero when none did.
	first, last time.Time
}

func (s *summary) print(w io.Writer, failure error) {
	c := s.counts
	fmt.Fprintln(w)
	fmt.Fprintln(w, "ferry demo: summary")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "  %s\t%s\n", k, v) }
	row("input", fmt.Sprintf("%s (%d lines)", s.input, s.lines))
	if c.posted < s.lines {
		row("posted", fmt.Sprintf("%d  (%d line(s) not posted: the demo stopped early)", c.posted, s.lines-c.posted))
	} else {
		row("posted", fmt.Sprintf("%d", c.posted))
	}
	row("accepted", fmt.Sprintf("%d", c.accepted))
	row("rejected", fmt.Sprintf("%d", c.rejected))
	for _, k := range sortedKeys(s.rejected) {
		row("", fmt.Sprintf("  %4d  %s", s.rejected[k], k))
	}
	row("sent", fmt.Sprintf("%d", c.sent))
	row("dead", fmt.Sprintf("%d  (after %d attempts, retry delays %s)", c.dead, s.maxAttempts, formatDelays(s.retryDelays)))
	for i, k := range sortedKeys(s.deadReasons) {
		if i == 5 {
			row("", fmt.Sprintf("  …and %d other reason(s)", len(s.deadReasons)-5))
			break
		}
		row("", fmt.Sprintf("  %4d  %s", s.deadReasons[k], clipText(k, 100)))
	}
	if pending := c.accepted - c.sent - c.dead; pending > 0 {
		where := "not sent or dead yet; kept in the database above, where ferry relay and ferry worker (or ferry run) finish them"
		if s.where.dbRemovedAtExit {
			where = "in the embedded database, which is removed at exit: run the demo with --data-dir to keep it"
		}
		row("still pending", fmt.Sprintf("%d  (%s)", pending, where))
		for _, n := range s.pending {
			line := fmt.Sprintf("  id %-6d %s, %d attempt(s)", n.id, n.status, n.attempts)
			if n.lastError != "" {
				line += ", last error: " + clipText(n.lastError, 80)
			}
			row("", line)
		}
		if more := pending - len(s.pending); more > 0 && len(s.pending) > 0 {
			row("", fmt.Sprintf("  …and %d more", more))
		}
	}
	row("duplicates absorbed", fmt.Sprintf("%d  (deliveries of an already processed message ID, acked without sending)", s.duplicates))
	final := c.sent + c.dead
	if span := s.last.Sub(s.first); final > 0 && span > 0 {
		row("throughput", fmt.Sprintf("%.1f notifications/s  (%d reached a final state in %.2fs: the first created_at to the last sent_at or dead, as the database recorded them)",
			float64(final)/span.Seconds(), final, span.Seconds()))
	} else {
		row("throughput", "n/a (nothing reached a final state)")
	}
	if c.sent > 0 {
		row("latency", fmt.Sprintf("p50 %s  p99 %s  (created_at → sent_at of the sent notifications)", roundDur(s.p50), roundDur(s.p99)))
	} else {
		row("latency", "n/a (nothing sent)")
	}
	row("database", s.where.database)
	row("broker", s.where.broker)
	row("relay", s.relayMode)
	smtp := s.where.smtp
	if s.where.sink != nil {
		smtp = s.where.sink.Where()
	}
	row("mail went to", smtp)
	if s.quiet != nil {
		for _, k := range sortedKeys(s.quiet.counts()) {
			row("warnings", fmt.Sprintf("%d × %s  (one per message, not printed; --log-level warn prints each)", s.quiet.counts()[k], k))
		}
	}
	row("result", s.verdict(failure))
	tw.Flush()
}

// nothingSent is the demo's failure when notifications were accepted and
// none was sent: every one is dead (or still pending), which the exit
// code must show. It names the most common reason and, when the mail
// server could not be reached, says so.
func (s *summary) nothingSent() error {
	c := s.counts
	if c.accepted == 0 || c.sent > 0 {
		return nil
	}
	what := fmt.Sprintf("ferry demo: nothing was sent: all %d accepted notifications are dead", c.accepted)
	if pending := c.accepted - c.dead; pending > 0 {
		what = fmt.Sprintf("ferry demo: nothing was sent: of %d accepted notifications %d are dead and %d still pending", c.accepted, c.dead, pending)
	}
	if reason, n := s.topReason(); n > 0 {
		what += fmt.Sprintf("; %d of them: %s", n, clipText(reason, 160))
		if smtpUnreachable(reason) {
			what += fmt.Sprintf(" (%s cannot be reached: start it, or point --%s at one)", s.where.smtp, flagSMTPAddr)
		}
	}
	return errors.New(what)
}

// verdict is the summary's last line: what happened, in plain words.
func (s *summary) verdict(failure error) string {
	c := s.counts
	switch {
	case failure != nil:
		return "FAILED: " + failure.Error()
	case c.dead == 0:
		return fmt.Sprintf("OK: all %d accepted notifications were sent", c.accepted)
	default:
		reason, n := s.topReason()
		return fmt.Sprintf("OK, with dead letters: %d sent, %d dead (%d of them: %s); see them with ferry dlq list", c.sent, c.dead, n, clipText(reason, 100))
	}
}

// topReason is the most common reason of the dead notifications and its
// count (ties by text).
func (s *summary) topReason() (string, int) {
	best, n := "", 0
	for _, k := range sortedKeys(s.deadReasons) {
		if s.deadReasons[k] > n {
			best, n = k, s.deadReasons[k]
		}
	}
	return best, n
}

// smtpUnreachable reports whether a dead notification's reason says the
// mail server could not be reached (as opposed to refusing the mail).
func smtpUnreachable(reason string) bool {
	r := strings.ToLower(reason)
	return strings.Contains(r, "smtp") && (strings.Contains(r, "connection refused") || strings.Contains(r, "no such host") ||
		strings.Contains(r, "i/o timeout") || strings.Contains(r, "network is unreachable") || strings.Contains(r, "dial"))
}

// relayModeText says which relay the demo runs, in the words of the
// README's relay sections.
func relayModeText(s *settings) string {
	if s.relayMode == outbox.RelayModeWAL {
		return "wal (reads the outbox inserts from PostgreSQL's WAL by logical replication; --relay-mode)"
	}
	return "poll (claims outbox rows with FOR UPDATE SKIP LOCKED and marks them published; --relay-mode wal reads the WAL instead)"
}

// finalSpan returns the time of the first of ids created and of the last
// to reach a final state, as the database recorded them.
func finalSpan(ctx context.Context, st *stack, ids []int64) (first, last time.Time, err error) {
	if len(ids) == 0 {
		return first, last, nil
	}
	var f, l *time.Time
	err = st.pool.QueryRow(ctx, `
		SELECT min(created_at), max(CASE WHEN status = 'sent' THEN COALESCE(sent_at, updated_at) ELSE updated_at END)
		FILTER (WHERE status IN ('sent', 'dead'))
		FROM notifications WHERE id = ANY($1)`, ids).Scan(&f, &l)
	if err != nil || f == nil || l == nil {
		return first, last, err
	}
	return *f, *l, nil
}

// quietHandler passes every record to the handler it wraps but the
// warnings the worker logs once per message, which it counts by message.
type quietHandler struct {
	slog.Handler
	mu *sync.Mutex
	n  map[string]int
}

// perMessageWarnings are the worker's WARN records that come once per
// message: a demo whose mail server is down has one per notification.
var perMessageWarnings = map[string]bool{
	"worker: message dead-lettered": true,
	"worker: redelivery of a message already bound for the DLQ; dead-lettering it without running the handler": true,
}

func newQuietHandler(h slog.Handler) *quietHandler {
	return &quietHandler{Handler: h, mu: &sync.Mutex{}, n: map[string]int{}}
}

func (h *quietHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn && perMessageWarnings[r.Message] {
		h.mu.Lock()
		h.n[r.Message]++
		h.mu.Unlock()
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h *quietHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &quietHandler{Handler: h.Handler.WithAttrs(as), mu: h.mu, n: h.n}
}

func (h *quietHandler) WithGroup(name string) slog.Handler {
	return &quietHandler{Handler: h.Handler.WithGroup(name), mu: h.mu, n: h.n}
}

// counts returns a copy of the counted warnings by message.
func (h *quietHandler) counts() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.n)
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	return keys
}

func formatDelays(ds []time.Duration) string {
	if len(ds) == 0 {
		return broker.DefaultRetryDelay.String()
	}
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = d.String()
	}
	return strings.Join(parts, ",")
}

func roundDur(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(100 * time.Microsecond)
	default:
		return d.Round(time.Microsecond)
	}
}

func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut] + "…"
}

// demoFigures are the demo's figures on the console's overview: lines
// posted, accepted and rejected by the API (with the reasons), and the
// accepted notifications sent and dead (the notifications table).
func demoFigures(st *stack, res *demoResult) func(ctx context.Context) ([]console.Figure, error) {
	return func(ctx context.Context) ([]console.Figure, error) {
		posted, accepted, rejected, ids := res.counts()
		res.mu.Lock()
		var why []string
		for _, k := range sortedKeys(res.rejected) {
			why = append(why, fmt.Sprintf("%d %s", res.rejected[k], k))
		}
		res.mu.Unlock()
		var cnt demoCounts
		if err := countFinal(ctx, st, ids, &cnt); err != nil {
			return nil, fmt.Errorf("ferry demo: reading the notifications: %w", err)
		}
		return []console.Figure{
			{Label: "posted", Value: int64(posted), Note: "lines posted to the API"},
			{Label: "accepted", Value: int64(accepted), Note: "into the outbox"},
			{Label: "rejected", Value: int64(rejected), Note: clipText(strings.Join(why, "; "), 200)},
			{Label: "sent", Value: int64(cnt.sent), Note: "notifications sent"},
			{Label: "dead", Value: int64(cnt.dead), Note: "notifications dead (see the DLQ)"},
		}, nil
	}
}
