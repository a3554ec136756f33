package ferrycli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ferrymq/ferry/app"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/dlq"
)

const (
	flagLimit         = "limit"
	flagErrorContains = "error-contains"
	flagID            = "id"
	flagAll           = "all"
	flagDryRun        = "dry-run"
	flagYes           = "yes"
	flagAppID         = "app-id"
)

func formatFlag() cli.Flag {
	return &cli.StringFlag{Name: flagFormat, Value: "table", EnvVars: env(flagFormat), Usage: "output format: table or json"}
}

// dlqFlags are the flags every dlq subcommand takes: the broker, the queue
// whose DLQ it reads, and where to look for it (--exchange); the log level
// when --log-level is not given is logLevel. The dlq commands declare
// nothing, so they take no --retry-delay; only list reads
// --rabbitmq-queue-type (withQueueType).
func dlqFlags(logLevel string, withQueueType bool) []cli.Flag {
	broker := brokerFlags(false, "RabbitMQ queue type of the DLQ: classic or quorum (a quorum queue is read whole, to list it oldest first) (--broker rabbitmq)")
	if !withQueueType {
		broker = without(broker, flagRabbitQueueType)
	}
	return concat(broker,
		[]cli.Flag{
			&cli.StringFlag{Name: flagExchange, EnvVars: env(flagExchange), Category: catTopology,
				Usage: "NATS and SQS: the exchange of --queue (NATS: its stream; SQS: the <exchange>__ prefix of its queue names); when not given, every exchange on the server is searched for the queue. RabbitMQ and Kafka: not needed (the DLQ is named after the queue alone)"},
			queueFlag(),
		}, logFlags(logLevel))
}

// queueFlag is --queue for the commands that act on one queue.
func queueFlag() cli.Flag {
	return &cli.StringFlag{Name: flagQueue, Value: app.DefaultQueue, EnvVars: env(flagQueue), Category: catTopology, Usage: "work queue; its DLQ is <queue>.dlq"}
}

func selectFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringSliceFlag{Name: flagID, Usage: "message ID to act on (repeatable, or comma-separated)"},
		&cli.BoolFlag{Name: flagAll, Usage: "act on every message in the DLQ"},
	}
}

func dlqCommand() *cli.Command {
	return &cli.Command{
		Name:  "dlq",
		Usage: "list, replay and purge the dead-letter queue of --queue (default notifications.send), the same on every broker; declares nothing, and fails for a queue the broker does not have",
		Subcommands: []*cli.Command{
			{
				Name:  "list",
				Usage: "list dead messages, oldest first: ID, application id, type, attempts, last error, first failure; says how many there are in all",
				Flags: concat(dlqFlags("warn", true), []cli.Flag{
					&cli.IntFlag{Name: flagLimit, Value: 100, Usage: "list at most this many (0: all); the total is counted either way"},
					&cli.StringFlag{Name: flagErrorContains, Usage: "only messages whose last error contains this text (case-insensitive)"},
					&cli.StringSliceFlag{Name: flagAppID, Usage: "only messages with this application id (x-app-id, e.g. the notification id; repeatable, or comma-separated)"},
					formatFlag(),
				}),
				Action: dlqList,
			},
			{
				Name:   "replay",
				Usage:  "move dead messages back to the work queue with their retry count reset (--id ID... or --all)",
				Flags:  concat(dlqFlags("info", false), selectFlags(), []cli.Flag{&cli.BoolFlag{Name: flagDryRun, Usage: "only show what would be replayed"}}),
				Action: dlqReplay,
			},
			{
				Name:   "purge",
				Usage:  "delete dead messages for good (--id ID... or --all, and --yes)",
				Flags:  concat(dlqFlags("info", false), selectFlags(), []cli.Flag{&cli.BoolFlag{Name: flagYes, Usage: "confirm the deletion"}}),
				Action: dlqPurge,
			},
		},
	}
}

// openDLQ connects to the broker once (no waiting: these are one-shot
// commands) and returns the DLQ of --queue. It declares nothing: the
// adapter looks the queue up on the server at the first operation (see
// broker.Broker.DLQ), so the command needs neither the bindings nor the
// retry delays, and a wrong --queue creates nothing. --exchange, when
// given, tells the adapter where to look (NATS).
func openDLQ(c *cli.Context, s *settings, log *slog.Logger) (broker.Broker, broker.DeadLetterQueue, error) {
	lookup := ""
	if c.IsSet(flagExchange) {
		lookup = s.exchange
		t := broker.Topology{Exchange: lookup, Queues: []broker.Queue{{Name: "q", Bindings: []string{"x"}}}}
		if err := t.Validate(); err != nil {
			return nil, nil, usagef("--%s %q: want letters, digits, '-', '_' or '.'", flagExchange, lookup)
		}
	}
	opts := s.brokerOpts
	opts.LookupExchange, opts.Logger = lookup, log
	b, err := OpenBroker(c.Context, s.broker, opts)
	if err != nil {
		if namesFlag(err) {
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("ferry: dlq: %s at %s: %w", s.broker, redactURL(s.brokerURL()), err)
	}
	d, err := b.DLQ(s.queue)
	if err != nil {
		b.Close()
		return nil, nil, dlqError(c, s, err)
	}
	return b, d, nil
}

// dlqError turns an error of the DLQ into the command's error. A queue
// the broker does not have (broker.ErrUnknownQueue) gets a message saying
// which flag is likely wrong; the adapter's detail follows.
func dlqError(c *cli.Context, s *settings, err error) error {
	if !errors.Is(err, broker.ErrUnknownQueue) {
		return fmt.Errorf("ferry: %s: %w", cmdName(c), err)
	}
	var where string
	switch {
	case (s.broker == "nats" || s.broker == "sqs") && c.IsSet(flagExchange):
		where = fmt.Sprintf("on %s exchange %q (is --%s or --%s right?)", s.broker, s.exchange, flagQueue, flagExchange)
	case s.broker == "nats" || s.broker == "sqs":
		where = fmt.Sprintf("on any %s exchange (is --%s right? --%s names the exchange to look on)", s.broker, flagQueue, flagExchange)
	default:
		where = fmt.Sprintf("on %s (is --%s right? its DLQ is <queue>.dlq)", s.broker, flagQueue)
	}
	return fmt.Errorf("ferry: %s: no queue %q %s: %w", cmdName(c), s.queue, where, err)
}

// notInDLQ is the error of replay and purge when some requested IDs were
// not in the DLQ labelled label (the others were acted on).
func notInDLQ(c *cli.Context, label string, missing []string, asked int, done string) error {
	return fmt.Errorf("ferry: %s: %d of %d requested ID(s) not in the DLQ %s: %s; %s",
		cmdName(c), len(missing), asked, label, strings.Join(missing, ", "), done)
}

// doneOthers says, in the error of a command that acted on some of the
// requested IDs (the others were not in the DLQ), what it did to them: a
// failing command prints no result line on stdout.
func doneOthers(verb string, done []string, to string) string {
	if len(done) == 0 {
		return "nothing " + verb
	}
	return fmt.Sprintf("the other %d %s%s%s", len(done), verb, to, listSuffix(done))
}

// dlqLabel names the DLQ of s.queue in the commands' output: ferry's name
// followed by where it is on the broker (broker.DeadLetterQueue.Where),
// e.g. `notifications.send.dlq (SQS queue
// "notifications__notifications-send-dlq")`, so the user finds it in the
// broker's console; ferry's name alone when the broker cannot say.
func dlqLabel(c *cli.Context, s *settings, d broker.DeadLetterQueue) string {
	name := broker.DLQName(s.queue)
	where, err := d.Where(c.Context)
	if err != nil || where == "" {
		return name
	}
	return name + " (" + where + ")"
}

// deadJSON is one dead message in `dlq list --format json`.
type deadJSON struct {
	ID            string            `json:"id"`
	AppID         string            `json:"app_id,omitempty"`
	Type          string            `json:"type"`
	Key           string            `json:"key,omitempty"`
	Attempts      int               `json:"attempts"`
	LastError     string            `json:"last_error"`
	FirstFailedAt *time.Time        `json:"first_failed_at,omitempty"`
	DeadAt        *time.Time        `json:"dead_at,omitempty"`
	Headers       map[string]string `json:"headers,omitempty"`
	Body          json.RawMessage   `json:"body,omitempty"`
	BodyText      string            `json:"body_text,omitempty"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func dlqList(c *cli.Context) error {
	s, log, err := setup(c, "warn")
	if err != nil {
		return err
	}
	format := c.String(flagFormat)
	if format != "table" && format != "json" {
		return usagef("--%s %q: want table or json", flagFormat, format)
	}
	limit := c.Int(flagLimit)
	if limit < 0 {
		return usagef("--%s %d: must be 0 (all) or more", flagLimit, limit)
	}
	f := dlq.Filter{ErrorContains: c.String(flagErrorContains)}
	for _, v := range c.StringSlice(flagAppID) {
		f.AppIDs = append(f.AppIDs, splitList(v)...)
	}
	b, d, err := openDLQ(c, s, log)
	if err != nil {
		return err
	}
	defer b.Close()
	// The whole DLQ is read, so the total is known and a cut list says so.
	msgs, err := d.List(c.Context, 0)
	if err != nil {
		return dlqError(c, s, err)
	}
	match := dlq.Match(msgs, f)
	label := dlqLabel(c, s, d)
	out := match
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	if format == "json" {
		return writeDeadJSON(c.App.Writer, out)
	}
	writeDeadTable(c.App.Writer, out)
	filtered := !f.Empty()
	switch {
	case len(out) < len(match) && filtered:
		fmt.Fprintf(c.App.Writer, "showing the oldest %d of %d matching dead message(s) (%d in the DLQ %s); --%s 0 lists all, --%s N more\n",
			len(out), len(match), len(msgs), label, flagLimit, flagLimit)
	case len(out) < len(match):
		fmt.Fprintf(c.App.Writer, "showing the oldest %d of %d dead message(s) in the DLQ %s; --%s 0 lists all, --%s N more, --format json for every field\n",
			len(out), len(match), label, flagLimit, flagLimit)
	case filtered:
		fmt.Fprintf(c.App.Writer, "%d matching dead message(s) (%d in the DLQ %s)\n", len(out), len(msgs), label)
	default:
		fmt.Fprintf(c.App.Writer, "%d dead message(s) in the DLQ %s\n", len(out), label)
	}
	return nil
}

func writeDeadJSON(w io.Writer, msgs []broker.DeadMessage) error {
	items := make([]deadJSON, 0, len(msgs))
	for _, m := range msgs {
		j := deadJSON{
			ID: m.Message.ID, AppID: m.Message.Headers[broker.HeaderAppID], Type: dlqType(m.Message.Type), Key: m.Message.Key, Attempts: m.Message.Attempt,
			LastError: m.LastError, FirstFailedAt: timePtr(firstFailed(m)), DeadAt: timePtr(m.DeadAt),
			Headers: m.Message.Headers,
		}
		if json.Valid(m.Message.Body) {
			j.Body = m.Message.Body
		} else {
			j.BodyText = string(m.Message.Body)
		}
		items = append(items, j)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(items)
}

// firstFailed is dlq.FirstFailed.
func firstFailed(m broker.DeadMessage) time.Time { return dlq.FirstFailed(m) }

func writeDeadTable(w io.Writer, msgs []broker.DeadMessage) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tAPP ID\tTYPE\tATTEMPTS\tFIRST FAILED\tLAST ERROR")
	for _, m := range msgs {
		first := "-"
		if t := firstFailed(m); !t.IsZero() {
			first = t.UTC().Format(time.RFC3339)
		}
		appID := m.Message.Headers[broker.HeaderAppID]
		if appID == "" {
			appID = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", m.Message.ID, clipText(appID, 40), dlqType(m.Message.Type), m.Message.Attempt, first, clipText(m.LastError, 120))
	}
	tw.Flush()
}

// selection returns the IDs of --id, or nil for --all; exactly one of them
// must be given.
func selection(c *cli.Context) ([]string, error) {
	var ids []string
	for _, v := range c.StringSlice(flagID) {
		for _, id := range strings.Split(v, ",") {
			if id = strings.TrimSpace(id); id != "" {
				ids = append(ids, id)
			}
		}
	}
	all := c.Bool(flagAll)
	switch {
	case all && len(ids) > 0:
		return nil, usagef("%s: give either --%s or --%s, not both", cmdName(c), flagID, flagAll)
	case !all && len(ids) == 0:
		return nil, usagef("%s: say which messages: --%s ID (repeatable) or --%s", cmdName(c), flagID, flagAll)
	}
	return ids, nil
}

// operator names who runs the command, for the audit log.
func operator() string {
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return "unknown"
}

func dlqReplay(c *cli.Context) error {
	ids, err := selection(c)
	if err != nil {
		return err
	}
	s, log, err := setup(c, "info")
	if err != nil {
		return err
	}
	b, d, err := openDLQ(c, s, log)
	if err != nil {
		return err
	}
	defer b.Close()
	who := operator()
	if c.Bool(flagDryRun) {
		msgs, err := d.List(c.Context, 0)
		if err != nil {
			return dlqError(c, s, err)
		}
		msgs = pick(msgs, ids)
		label := dlqLabel(c, s, d)
		found := make([]string, 0, len(msgs))
		for _, m := range msgs {
			found = append(found, m.Message.ID)
		}
		if missing := notIn(ids, found); len(missing) > 0 {
			return notInDLQ(c, label, missing, len(ids), "dry run: nothing replayed")
		}
		fmt.Fprintf(c.App.Writer, "dry run: would replay %d message(s) from the DLQ %s to %s:\n", len(msgs), label, s.queue)
		writeDeadTable(c.App.Writer, msgs)
		return nil
	}
	label := dlqLabel(c, s, d)
	// dlq.Replay reads what is about to move so the audit line says what it was.
	done, err := dlq.Replay(c.Context, d, s.queue, ids, dlq.Actor{By: who, Log: log})
	if err != nil {
		if errors.Is(err, broker.ErrUnknownQueue) {
			return dlqError(c, s, err)
		}
		return fmt.Errorf("ferry: dlq replay: %d replayed before the error: %w", len(done), err)
	}
	if missing := notIn(ids, done); len(missing) > 0 {
		return notInDLQ(c, label, missing, len(ids), doneOthers("replayed", done, " to "+s.queue))
	}
	fmt.Fprintf(c.App.Writer, "replayed %d message(s) from the DLQ %s to %s%s\n", len(done), label, s.queue, listSuffix(done))
	return nil
}

func dlqPurge(c *cli.Context) error {
	ids, err := selection(c)
	if err != nil {
		return err
	}
	if !c.Bool(flagYes) {
		what := "the " + fmt.Sprint(len(ids)) + " given message(s)"
		if ids == nil {
			what = "every message"
		}
		return usagef("dlq purge deletes %s in the DLQ of %s for good: add --%s to confirm (or look first with ferry dlq list)", what, c.String(flagQueue), flagYes)
	}
	s, log, err := setup(c, "info")
	if err != nil {
		return err
	}
	b, d, err := openDLQ(c, s, log)
	if err != nil {
		return err
	}
	defer b.Close()
	label := dlqLabel(c, s, d)
	done, err := dlq.Purge(c.Context, d, s.queue, ids, dlq.Actor{By: operator(), Log: log})
	if err != nil {
		if errors.Is(err, broker.ErrUnknownQueue) {
			return dlqError(c, s, err)
		}
		return fmt.Errorf("ferry: dlq purge: %d purged before the error: %w", len(done), err)
	}
	if missing := notIn(ids, done); len(missing) > 0 {
		return notInDLQ(c, label, missing, len(ids), doneOthers("purged", done, ""))
	}
	fmt.Fprintf(c.App.Writer, "purged %d message(s) from the DLQ %s%s\n", len(done), label, listSuffix(done))
	return nil
}

func pick(msgs []broker.DeadMessage, ids []string) []broker.DeadMessage { return dlq.Pick(msgs, ids) }

func notIn(ids, done []string) []string { return dlq.Missing(ids, done) }

func listSuffix(ids []string) string {
	if len(ids) == 0 || len(ids) > 20 {
		return ""
	}
	return ": " + strings.Join(ids, ", ")
}

// dlqType is the event type a dead message was enqueued with: its Type
// without the priority prefix a priority level's messages travel with
// (broker.PriorityType), as the handler saw it.
func dlqType(t string) string {
	_, typ := broker.SplitPriorityType(t)
	return typ
}
