package ferrycli

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ferrymq/ferry/outbox"
)

func outboxCommand() *cli.Command {
	return &cli.Command{
		Name:  "outbox",
		Usage: "inspect the outbox, retry or drop parked rows",
		Subcommands: []*cli.Command{{
			Name:   "stats",
			Usage:  "unprocessed rows, age of the oldest, rows published in the last minute and hour, parked rows; split by destination when there are several",
			Flags:  concat(databaseFlags(false), logFlags("warn"), []cli.Flag{formatFlag()}),
			Action: outboxStats,
		}, {
			Name:   "retry",
			Usage:  "make parked rows (see outbox stats) due now: the next claim of any relay publishes them, whatever their backoff; logged with who and when",
			Flags:  concat(databaseFlags(false), logFlags("info"), []cli.Flag{parkedIDFlag()}),
			Action: func(c *cli.Context) error { return outboxParked(c, "retry") },
		}, {
			Name:   "drop",
			Usage:  "delete parked rows for good (their events are never published); needs --yes; logged with who, when and what the row was",
			Flags:  concat(databaseFlags(false), logFlags("info"), []cli.Flag{parkedIDFlag(), &cli.BoolFlag{Name: flagYes, Usage: "confirm the deletion"}}),
			Action: func(c *cli.Context) error { return outboxParked(c, "drop") },
		}},
	}
}

func parkedIDFlag() cli.Flag {
	return &cli.StringSliceFlag{Name: flagID, Usage: "outbox row id of a parked row (repeatable, or comma-separated)"}
}

// outboxParked is `ferry outbox retry` and `ferry outbox drop`: each row
// acted on is logged at INFO like a DLQ replay (id, type, attempts,
// last_error, by, at); ids that are not parked rows fail the command after
// the others were done.
func outboxParked(c *cli.Context, op string) error {
	var ids []int64
	for _, v := range c.StringSlice(flagID) {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f == "" {
				continue
			}
			id, err := strconv.ParseInt(f, 10, 64)
			if err != nil || id <= 0 {
				return usagef("outbox %s: --%s %q: want a positive outbox row id", op, flagID, f)
			}
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return usagef("outbox %s: say which rows: --%s ID (repeatable); ferry outbox stats lists the parked rows", op, flagID)
	}
	if op == "drop" && !c.Bool(flagYes) {
		return usagef("outbox drop deletes %d row(s) for good, their events are never published: add --%s to confirm", len(ids), flagYes)
	}
	s, log, err := setup(c, "info")
	if err != nil {
		return err
	}
	st, err := openStack(c.Context, s, log, false)
	if err != nil {
		return err
	}
	defer st.close()
	if err := st.checkSchema(c.Context, false); err != nil {
		return err
	}
	fn := outbox.RetryParked
	if op == "drop" {
		fn = outbox.DropParked
	}
	who := operator()
	var done, missing []string
	for _, id := range ids {
		p, err := fn(c.Context, st.pool, id)
		if errors.Is(err, outbox.ErrNotParked) {
			missing = append(missing, strconv.FormatInt(id, 10))
			continue
		}
		if err != nil {
			return fmt.Errorf("ferry: outbox %s: %d done before the error: %w", op, len(done), err)
		}
		outbox.AuditParked(log, op, p, who)
		done = append(done, strconv.FormatInt(id, 10))
	}
	verb := map[string]string{"retry": "made due now", "drop": "dropped"}[op]
	if len(missing) > 0 {
		// A failing command prints no result line: the error says what
		// was done.
		return fmt.Errorf("ferry: outbox %s: %d of %d id(s) are not parked rows (no unprocessed row with failed attempts): %s; see ferry outbox stats; %s",
			op, len(missing), len(ids), strings.Join(missing, ", "), doneOthers(verb, done, ""))
	}
	fmt.Fprintf(c.App.Writer, "%s %d parked row(s)%s\n", verb, len(done), listSuffix(done))
	return nil
}

// statsJSON is `outbox stats --format json`.
type statsJSON struct {
	Unprocessed             int64        `json:"unprocessed"`
	OldestUnprocessedAgeSec float64      `json:"oldest_unprocessed_age_seconds"`
	Scheduled               int64        `json:"scheduled"`
	ProcessedLastMinute     int64        `json:"processed_last_minute"`
	ProcessedLastHour       int64        `json:"processed_last_hour"`
	Parked                  int64        `json:"parked"`
	ParkedRows              []parkedJSON `json:"parked_rows"`
	Destinations            []destJSON   `json:"destinations"`
}

type destJSON struct {
	Destination string `json:"destination"`
	Unprocessed int64  `json:"unprocessed"`
	Scheduled   int64  `json:"scheduled"`
	Parked      int64  `json:"parked"`
}

type parkedJSON struct {
	ID            int64      `json:"id"`
	Destination   string     `json:"destination"`
	Type          string     `json:"type"`
	Attempts      int        `json:"attempts"`
	LastError     string     `json:"last_error"`
	OccurredAt    time.Time  `json:"occurred_at"`
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
}

func outboxStats(c *cli.Context) error {
	s, log, err := setup(c, "warn")
	if err != nil {
		return err
	}
	format := c.String(flagFormat)
	if format != "table" && format != "json" {
		return usagef("--%s %q: want table or json", flagFormat, format)
	}
	st, err := openStack(c.Context, s, log, false)
	if err != nil {
		return err
	}
	defer st.close()
	// The same check as the relay's: on a database without the outbox
	// table, "run ferry migrate first" rather than the raw SQLSTATE 42P01.
	if err := st.checkSchema(c.Context, false); err != nil {
		return err
	}
	stats, err := outbox.ReadStats(c.Context, st.pool)
	if err != nil {
		return fmt.Errorf("ferry: outbox stats: %w", err)
	}
	w := c.App.Writer
	if format == "json" {
		j := statsJSON{
			Unprocessed: stats.Unprocessed, OldestUnprocessedAgeSec: stats.OldestUnprocessedAge.Seconds(),
			Scheduled:           stats.Scheduled,
			ProcessedLastMinute: stats.ProcessedLastMinute, ProcessedLastHour: stats.ProcessedLastHour,
			Parked: stats.Parked, ParkedRows: []parkedJSON{}, Destinations: []destJSON{},
		}
		for _, d := range stats.Destinations {
			j.Destinations = append(j.Destinations, destJSON{Destination: d.Destination, Unprocessed: d.Unprocessed, Scheduled: d.Scheduled, Parked: d.Parked})
		}
		for _, p := range stats.ParkedRows {
			j.ParkedRows = append(j.ParkedRows, parkedJSON{ID: p.ID, Destination: p.Destination, Type: p.Type, Attempts: p.Attempts, LastError: p.LastError, OccurredAt: p.OccurredAt, NextAttemptAt: timePtr(p.NextAttemptAt)})
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(j)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "unprocessed\t%d\n", stats.Unprocessed)
	fmt.Fprintf(tw, "oldest unprocessed age\t%s\n", stats.OldestUnprocessedAge.Round(time.Millisecond))
	fmt.Fprintf(tw, "scheduled (not yet due)\t%d\n", stats.Scheduled)
	fmt.Fprintf(tw, "processed last minute\t%d\n", stats.ProcessedLastMinute)
	fmt.Fprintf(tw, "processed last hour\t%d\n", stats.ProcessedLastHour)
	fmt.Fprintf(tw, "parked (publication failed)\t%d\n", stats.Parked)
	tw.Flush()
	if len(stats.Destinations) > 1 || (len(stats.Destinations) == 1 && stats.Destinations[0].Destination != outbox.DefaultDestination) {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "DESTINATION\tUNPROCESSED\tSCHEDULED\tPARKED")
		for _, d := range stats.Destinations {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", d.Destination, d.Unprocessed, d.Scheduled, d.Parked)
		}
		tw.Flush()
	}
	if len(stats.ParkedRows) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tDESTINATION\tTYPE\tATTEMPTS\tOCCURRED AT\tNEXT ATTEMPT\tLAST ERROR")
		for _, p := range stats.ParkedRows {
			next := "next batch"
			if !p.NextAttemptAt.IsZero() {
				next = p.NextAttemptAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\n", p.ID, p.Destination, p.Type, p.Attempts, p.OccurredAt.UTC().Format(time.RFC3339), next, clipText(p.LastError, 100))
		}
		tw.Flush()
	}
	return nil
}
