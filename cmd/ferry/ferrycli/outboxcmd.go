package ferrycli

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ferrymq/ferry/outbox"
)

func outboxCommand() *cli.Command {
	return &cli.Command{
		Name:  "outbox",
		Usage: "inspect the outbox",
		Subcommands: []*cli.Command{{
			Name:   "stats",
			Usage:  "unprocessed rows, age of the oldest, rows published in the last minute and hour, parked rows",
			Flags:  concat(databaseFlags(), logFlags(), []cli.Flag{formatFlag()}),
			Action: outboxStats,
		}},
	}
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
}

type parkedJSON struct {
	ID            int64      `json:"id"`
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
			Parked: stats.Parked, ParkedRows: []parkedJSON{},
		}
		for _, p := range stats.ParkedRows {
			j.ParkedRows = append(j.ParkedRows, parkedJSON{ID: p.ID, Type: p.Type, Attempts: p.Attempts, LastError: p.LastError, OccurredAt: p.OccurredAt, NextAttemptAt: timePtr(p.NextAttemptAt)})
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
	if len(stats.ParkedRows) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tTYPE\tATTEMPTS\tOCCURRED AT\tNEXT ATTEMPT\tLAST ERROR")
		for _, p := range stats.ParkedRows {
			next := "next batch"
			if !p.NextAttemptAt.IsZero() {
				next = p.NextAttemptAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\n", p.ID, p.Type, p.Attempts, p.OccurredAt.UTC().Format(time.RFC3339), next, clipText(p.LastError, 100))
		}
		tw.Flush()
	}
	return nil
}
