package ferrycli

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ferrymq/ferry/outbox"
)

const (
	flagState = "state"
	flagType  = "type"
)

// jobsCommand is `ferry jobs get|list|cancel|workflow`, over
// outbox.JobGet, JobGetByAppID, JobList, JobCancel and WorkflowGet.
func jobsCommand() *cli.Command {
	appID := func() cli.Flag {
		return &cli.StringFlag{Name: flagAppID, Usage: "the jobs whose event carries this application id (x-app-id) instead of an ID"}
	}
	return &cli.Command{
		Name:  "jobs",
		Usage: "find a job (an outbox event) by message ID or app id, see its state and history, cancel it; show a workflow",
		Subcommands: []*cli.Command{{
			Name:      "get",
			Usage:     "state (held, scheduled, pending, published, retrying, handled, dead, cancelled), consumers, history",
			ArgsUsage: "ID (the message ID, the outbox row id) | --app-id X",
			Flags:     concat(databaseFlags(false), logFlags("warn"), []cli.Flag{appID(), formatFlag()}),
			Action:    jobsGet,
		}, {
			Name:  "list",
			Usage: "the newest jobs, optionally of one state and type",
			Flags: concat(databaseFlags(false), logFlags("warn"), []cli.Flag{
				&cli.StringFlag{Name: flagState, Usage: "only jobs in this state: held, scheduled, pending, published, retrying, handled, dead, cancelled"},
				&cli.StringFlag{Name: flagType, Usage: "only jobs of this event type"},
				&cli.IntFlag{Name: flagLimit, Value: 50, Usage: fmt.Sprintf("list at most this many (1 to %d)", outbox.MaxJobList)},
				formatFlag(),
			}),
			Action: jobsList,
		}, {
			Name:      "cancel",
			Usage:     "cancel a job not yet published (it is never published); needs --yes; logged with who and when",
			ArgsUsage: "ID | --app-id X",
			Flags:     concat(databaseFlags(false), logFlags("info"), []cli.Flag{appID(), &cli.BoolFlag{Name: flagYes, Usage: "confirm the cancel"}}),
			Action:    jobsCancel,
		}, {
			Name:      "workflow",
			Usage:     "a workflow's jobs (ferry.EnqueueWorkflow): each job's state, what it waits for, how it settled",
			ArgsUsage: "WORKFLOW-ID",
			Flags:     concat(databaseFlags(false), logFlags("warn"), []cli.Flag{formatFlag()}),
			Action:    jobsWorkflow,
		}},
	}
}

// jobTarget reads the ID argument or --app-id of get and cancel.
func jobTarget(c *cli.Context, op string) (id int64, appID string, err error) {
	appID = c.String(flagAppID)
	args := c.Args().Slice()
	switch {
	case len(args) > 1:
		return 0, "", usagef("jobs %s: one ID at a time, got %d arguments (flags go before the ID)", op, len(args))
	case len(args) == 1 && appID != "":
		return 0, "", usagef("jobs %s: give an ID or --%s, not both", op, flagAppID)
	case len(args) == 0 && appID == "":
		return 0, "", usagef("jobs %s: say which job: ferry jobs %s ID (the message ID) or --%s X; ferry jobs list lists them", op, op, flagAppID)
	case len(args) == 1:
		id, err = strconv.ParseInt(args[0], 10, 64)
		if err != nil || id <= 0 {
			return 0, "", usagef("jobs %s: ID %q: want a positive message ID (the outbox row id)", op, args[0])
		}
	}
	return id, appID, nil
}

func jobsStack(c *cli.Context, level string) (*stack, error) {
	s, log, err := setupWithArgs(c, level) // the ID argument was read by jobTarget
	if err != nil {
		return nil, err
	}
	return openMigratedStack(c.Context, s, log)
}

func checkFormat(c *cli.Context) (string, error) {
	format := c.String(flagFormat)
	if format != "table" && format != "json" {
		return "", usagef("--%s %q: want table or json", flagFormat, format)
	}
	return format, nil
}

func jobsGet(c *cli.Context) error {
	id, appID, err := jobTarget(c, "get")
	if err != nil {
		return err
	}
	format, err := checkFormat(c)
	if err != nil {
		return err
	}
	st, err := jobsStack(c, "warn")
	if err != nil {
		return err
	}
	defer st.close()
	var jobs []outbox.Job
	if appID != "" {
		jobs, err = outbox.JobGetByAppID(c.Context, st.pool, appID)
	} else {
		var j outbox.Job
		j, err = outbox.JobGet(c.Context, st.pool, id)
		jobs = []outbox.Job{j}
	}
	if err != nil {
		return fmt.Errorf("ferry: jobs get: %w", err)
	}
	w := c.App.Writer
	if format == "json" {
		out := make([]jobJSON, len(jobs))
		for i, j := range jobs {
			out[i] = toJobJSON(j)
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if appID == "" {
			return enc.Encode(out[0])
		}
		return enc.Encode(out)
	}
	for i, j := range jobs {
		if i > 0 {
			fmt.Fprintln(w)
		}
		printJob(w, j)
	}
	return nil
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}

func printJob(w io.Writer, j outbox.Job) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "id\t%d\n", j.ID)
	fmt.Fprintf(tw, "state\t%s\n", j.State)
	if j.InOutbox {
		fmt.Fprintf(tw, "destination\t%s\n", j.Destination)
		fmt.Fprintf(tw, "type\t%s\n", j.Type)
		fmt.Fprintf(tw, "key\t%s\n", j.Key)
		fmt.Fprintf(tw, "app id\t%s\n", j.AppID)
		fmt.Fprintf(tw, "enqueued at\t%s\n", fmtTime(j.EnqueuedAt))
		fmt.Fprintf(tw, "due at\t%s\n", fmtTime(j.DueAt))
		fmt.Fprintf(tw, "publish attempts failed\t%d\n", j.PublishAttempts)
		fmt.Fprintf(tw, "published at\t%s\n", fmtTime(j.PublishedAt))
		if !j.CancelledAt.IsZero() {
			fmt.Fprintf(tw, "cancelled at\t%s\n", fmtTime(j.CancelledAt))
		}
		if j.CancelReason != "" {
			fmt.Fprintf(tw, "cancelled because\t%s\n", j.CancelReason)
		}
		if j.WorkflowID != 0 {
			fmt.Fprintf(tw, "workflow\t%d (ferry jobs workflow %d)\n", j.WorkflowID, j.WorkflowID)
		}
	} else {
		fmt.Fprintf(tw, "outbox row\tdeleted by retention after publication\n")
	}
	tw.Flush()
	if len(j.Consumers) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "CONSUMER\tSTATE\tATTEMPTS\tLAST ERROR")
		for _, c := range j.Consumers {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", c.Consumer, c.State, c.Attempts, clipText(c.LastError, 100))
		}
		tw.Flush()
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tEVENT\tCONSUMER\tDETAIL")
	for _, e := range j.History {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", fmtTime(e.At), e.What, e.Consumer, clipText(e.Detail, 160))
	}
	tw.Flush()
}

func jobsList(c *cli.Context) error {
	if c.Args().Len() > 0 {
		return usagef("jobs list takes no arguments, got %q (see --%s, --%s)", c.Args().First(), flagState, flagType)
	}
	format, err := checkFormat(c)
	if err != nil {
		return err
	}
	limit := c.Int(flagLimit)
	if limit < 1 || limit > outbox.MaxJobList {
		return usagef("--%s %d: want 1 to %d", flagLimit, limit, outbox.MaxJobList)
	}
	state := outbox.JobState(c.String(flagState))
	switch state {
	case "", outbox.JobHeld, outbox.JobScheduled, outbox.JobPending, outbox.JobPublished, outbox.JobRetrying, outbox.JobHandled, outbox.JobDead, outbox.JobCancelled:
	default:
		return usagef("--%s %q: want held, scheduled, pending, published, retrying, handled, dead or cancelled", flagState, state)
	}
	st, err := jobsStack(c, "warn")
	if err != nil {
		return err
	}
	defer st.close()
	jobs, err := outbox.JobList(c.Context, st.pool, outbox.JobFilter{State: state, Type: c.String(flagType), Limit: limit})
	if err != nil {
		return fmt.Errorf("ferry: jobs list: %w", err)
	}
	w := c.App.Writer
	if format == "json" {
		out := make([]jobJSON, len(jobs))
		for i, j := range jobs {
			out[i] = toJobJSON(j)
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tDESTINATION\tTYPE\tAPP ID\tENQUEUED AT\tLAST ERROR")
	for _, j := range jobs {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", j.ID, j.State, j.Destination, j.Type, j.AppID, fmtTime(j.EnqueuedAt), clipText(lastError(j), 80))
	}
	tw.Flush()
	fmt.Fprintf(w, "%d job(s)\n", len(jobs))
	return nil
}

// lastError is the latest error recorded for j: a consumer's, else the
// publication's.
func lastError(j outbox.Job) string {
	for _, c := range j.Consumers {
		if c.LastError != "" {
			return c.Consumer + ": " + c.LastError
		}
	}
	if j.PublishedAt.IsZero() {
		return j.PublishError
	}
	return ""
}

func jobsCancel(c *cli.Context) error {
	id, appID, err := jobTarget(c, "cancel")
	if err != nil {
		return err
	}
	if !c.Bool(flagYes) {
		return usagef("jobs cancel: a cancelled job is never published: add --%s to confirm", flagYes)
	}
	st, err := jobsStack(c, "info")
	if err != nil {
		return err
	}
	defer st.close()
	ids := []int64{id}
	var already []string // cancelled before: left as they are
	if appID != "" {
		jobs, err := outbox.JobGetByAppID(c.Context, st.pool, appID)
		if err != nil {
			return fmt.Errorf("ferry: jobs cancel: %w", err)
		}
		ids = ids[:0]
		for _, j := range jobs {
			if j.State == outbox.JobCancelled {
				already = append(already, strconv.FormatInt(j.ID, 10))
				continue
			}
			ids = append(ids, j.ID)
		}
	}
	who := operator()
	var done, late []string
	for _, id := range ids {
		j, err := outbox.JobCancel(c.Context, st.pool, id)
		switch {
		case errors.Is(err, outbox.ErrTooLate):
			if len(ids) == 1 {
				return fmt.Errorf("ferry: jobs cancel: %w", err)
			}
			late = append(late, fmt.Sprintf("%d (%s)", id, j.State))
			continue
		case err != nil:
			return fmt.Errorf("ferry: jobs cancel: %d cancelled before the error%s: %w", len(done), listSuffix(done), err)
		}
		st.log.Info("jobs cancel", "id", j.ID, "destination", j.Destination, "type", j.Type, "app_id", j.AppID,
			"by", who, "at", time.Now().UTC().Format(time.RFC3339))
		done = append(done, strconv.FormatInt(id, 10))
	}
	if len(late) > 0 {
		return fmt.Errorf("ferry: jobs cancel: too late for %d of %d job(s), published or being published: %s; %s",
			len(late), len(ids), strings.Join(late, ", "), doneOthers("cancelled", done, ""))
	}
	note := ""
	if len(already) > 0 {
		note = fmt.Sprintf(" (already cancelled: %s)", strings.Join(already, ", "))
	}
	fmt.Fprintf(c.App.Writer, "cancelled %d job(s), never to be published%s%s\n", len(done), listSuffix(done), note)
	return nil
}

// jobJSON is a job in `jobs get|list --format json`.
type jobJSON struct {
	ID              int64          `json:"id"`
	State           string         `json:"state"`
	InOutbox        bool           `json:"in_outbox"`
	Destination     string         `json:"destination,omitempty"`
	Type            string         `json:"type,omitempty"`
	Key             string         `json:"key,omitempty"`
	AppID           string         `json:"app_id,omitempty"`
	EnqueuedAt      *time.Time     `json:"enqueued_at,omitempty"`
	DueAt           *time.Time     `json:"due_at,omitempty"`
	PublishAttempts int            `json:"publish_attempts"`
	PublishError    string         `json:"publish_error,omitempty"`
	PublishedAt     *time.Time     `json:"published_at,omitempty"`
	CancelledAt     *time.Time     `json:"cancelled_at,omitempty"`
	Consumers       []consumerJSON `json:"consumers"`
	History         []historyJSON  `json:"history"`
}

type consumerJSON struct {
	Consumer      string     `json:"consumer"`
	State         string     `json:"state"`
	Attempts      int        `json:"attempts"`
	LastError     string     `json:"last_error,omitempty"`
	FirstFailedAt *time.Time `json:"first_failed_at,omitempty"`
	LastFailedAt  *time.Time `json:"last_failed_at,omitempty"`
	HandledAt     *time.Time `json:"handled_at,omitempty"`
	DeadAt        *time.Time `json:"dead_at,omitempty"`
}

type historyJSON struct {
	At       *time.Time `json:"at,omitempty"`
	Event    string     `json:"event"`
	Consumer string     `json:"consumer,omitempty"`
	Detail   string     `json:"detail,omitempty"`
}

func toJobJSON(j outbox.Job) jobJSON {
	out := jobJSON{ID: j.ID, State: string(j.State), InOutbox: j.InOutbox, Destination: j.Destination, Type: j.Type, Key: j.Key, AppID: j.AppID,
		EnqueuedAt: timePtr(j.EnqueuedAt), DueAt: timePtr(j.DueAt), PublishAttempts: j.PublishAttempts, PublishError: j.PublishError,
		PublishedAt: timePtr(j.PublishedAt), CancelledAt: timePtr(j.CancelledAt), Consumers: []consumerJSON{}, History: []historyJSON{}}
	for _, c := range j.Consumers {
		out.Consumers = append(out.Consumers, consumerJSON{Consumer: c.Consumer, State: string(c.State), Attempts: c.Attempts, LastError: c.LastError,
			FirstFailedAt: timePtr(c.FirstFailedAt), LastFailedAt: timePtr(c.LastFailedAt), HandledAt: timePtr(c.HandledAt), DeadAt: timePtr(c.DeadAt)})
	}
	for _, e := range j.History {
		out.History = append(out.History, historyJSON{At: timePtr(e.At), Event: e.What, Consumer: e.Consumer, Detail: e.Detail})
	}
	return out
}

func jobsWorkflow(c *cli.Context) error {
	args := c.Args().Slice()
	switch {
	case len(args) == 0:
		return usagef("jobs workflow: say which workflow: ferry jobs workflow WORKFLOW-ID (ferry.EnqueueWorkflow returns it; ferry jobs get shows a job's)")
	case len(args) > 1:
		return usagef("jobs workflow: one WORKFLOW-ID at a time, got %d arguments (flags go before the ID)", len(args))
	}
	id, err := strconv.ParseInt(args[0], 10, 64)
	if err != nil || id <= 0 {
		return usagef("jobs workflow: WORKFLOW-ID %q: want a positive workflow id", args[0])
	}
	format, err := checkFormat(c)
	if err != nil {
		return err
	}
	st, err := jobsStack(c, "warn")
	if err != nil {
		return err
	}
	defer st.close()
	wf, err := outbox.WorkflowGet(c.Context, st.pool, id)
	if err != nil {
		return fmt.Errorf("ferry: jobs workflow: %w", err)
	}
	w := c.App.Writer
	if format == "json" {
		out := workflowJSON{ID: wf.ID, Name: wf.Name, CreatedAt: wf.CreatedAt, Done: wf.Done, Failed: wf.Failed, Cancelled: wf.Cancelled, Jobs: []workflowJobJSON{}}
		for _, j := range wf.Jobs {
			out.Jobs = append(out.Jobs, workflowJobJSON{ID: j.ID, Name: j.Name, Type: j.Type, State: string(j.State), Layer: j.Layer,
				After: append([]int64{}, j.After...), Waiting: j.Waiting, Outcome: j.Outcome, SettledBy: j.SettledBy,
				SettledAt: timePtr(j.SettledAt), ReleasedAt: timePtr(j.ReleasedAt), Consumer: j.Consumer, ReleaseOnFailure: j.ReleaseOnFailure})
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	fmt.Fprintf(w, "workflow %d %q, enqueued at %s: %d job(s), %d completed, %d failed, %d cancelled\n\n",
		wf.ID, wf.Name, fmtTime(wf.CreatedAt), len(wf.Jobs), wf.Done, wf.Failed, wf.Cancelled)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LAYER\tID\tNAME\tTYPE\tSTATE\tAFTER\tWAITING FOR\tSETTLED")
	for _, j := range wf.Jobs {
		after := make([]string, len(j.After))
		for i, d := range j.After {
			after[i] = strconv.FormatInt(d, 10)
		}
		settled := "-"
		if j.Outcome != "" {
			settled = j.Outcome
			if j.SettledBy != "" {
				settled += " by " + j.SettledBy
			}
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t%d\t%s\n", j.Layer, j.ID, j.Name, j.Type, j.State,
			clipText(cmp.Or(strings.Join(after, ","), "-"), 60), j.Waiting, settled)
	}
	return tw.Flush()
}

// workflowJSON is a workflow in `jobs workflow --format json`.
type workflowJSON struct {
	ID        int64             `json:"id"`
	Name      string            `json:"name"`
	CreatedAt time.Time         `json:"created_at"`
	Done      int               `json:"completed"`
	Failed    int               `json:"failed"`
	Cancelled int               `json:"cancelled"`
	Jobs      []workflowJobJSON `json:"jobs"`
}

type workflowJobJSON struct {
	ID               int64      `json:"id"`
	Name             string     `json:"name"`
	Type             string     `json:"type,omitempty"`
	State            string     `json:"state"`
	Layer            int        `json:"layer"`
	After            []int64    `json:"after"`
	Waiting          int        `json:"waiting"`
	Outcome          string     `json:"outcome,omitempty"`
	SettledBy        string     `json:"settled_by,omitempty"`
	SettledAt        *time.Time `json:"settled_at,omitempty"`
	ReleasedAt       *time.Time `json:"released_at,omitempty"`
	Consumer         string     `json:"consumer,omitempty"`
	ReleaseOnFailure bool       `json:"release_on_failure,omitempty"`
}
