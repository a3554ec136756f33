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
			Usage:  "unprocessed rows, age of the oldest, rows published in the last minute and hour, parked rows; split by destination when there are several; the WAL relays' replication slots (retained WAL, oldest unconfirmed event)",
			Flags:  concat(databaseFlags(false), logFlags("warn"), []cli.Flag{formatFlag()}),
			Action: outboxStats,
		}, {
			Name:   "retry",
			Usage:  "make parked rows (see outbox stats) due now: the next claim of any relay publishes them, whatever their backoff (in --relay-mode=wal too: parked rows stay in the table for the relay's polling side); logged with who and when",
			Flags:  concat(databaseFlags(false), logFlags("info"), []cli.Flag{parkedIDFlag()}),
			Action: func(c *cli.Context) error { return outboxParked(c, "retry") },
		}, {
			Name:   "drop",
			Usage:  "delete parked rows for good (their events are never published); needs --yes; logged with who, when and what the row was",
			Flags:  concat(databaseFlags(false), logFlags("info"), []cli.Flag{parkedIDFlag(), &cli.BoolFlag{Name: flagYes, Usage: "confirm the deletion"}}),
			Action: func(c *cli.Context) error { return outboxParked(c, "drop") },
		}, {
			Name: "wal-reset",
			Usage: "after a WAL relay stopped on a dropped or invalidated replication slot (outbox.ErrSlotLost): hand the events it had not confirmed (the outbox rows left) to the polling side of the relay and forget the slot, " +
				"so that the next start of ferry relay --relay-mode=wal creates a new one; needs --yes",
			Flags:  concat(databaseFlags(false), logFlags("info"), destinationFlags(), walSlotFlags(), []cli.Flag{&cli.BoolFlag{Name: flagYes, Usage: "confirm the reset"}}),
			Action: outboxWALReset,
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
	st, err := openMigratedStack(c.Context, s, log)
	if err != nil {
		return err
	}
	defer st.close()
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
	// WAL lists the WAL relays' slots (outbox_wal_slots), empty when no
	// relay runs in WAL mode.
	WAL []walJSON `json:"wal"`
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
	st, err := openMigratedStack(c.Context, s, log)
	if err != nil {
		return err
	}
	defer st.close()
	stats, err := outbox.ReadStats(c.Context, st.pool)
	if err != nil {
		return fmt.Errorf("ferry: outbox stats: %w", err)
	}
	wal, err := outbox.ListWALStats(c.Context, st.pool)
	if err != nil {
		return fmt.Errorf("ferry: outbox stats: %w", err)
	}
	w := c.App.Writer
	if format == "json" {
		j := statsJSON{
			Unprocessed: stats.Unprocessed, OldestUnprocessedAgeSec: stats.OldestUnprocessedAge.Seconds(),
			Scheduled:           stats.Scheduled,
			ProcessedLastMinute: stats.ProcessedLastMinute, ProcessedLastHour: stats.ProcessedLastHour,
			Parked: stats.Parked, ParkedRows: []parkedJSON{}, Destinations: []destJSON{}, WAL: []walJSON{},
		}
		for _, x := range wal {
			j.WAL = append(j.WAL, walJSON{Slot: x.Slot, Destination: x.Destination, Exists: x.Exists, Active: x.Active, WALStatus: x.WALStatus,
				RetainedBytes: x.RetainedBytes, ConfirmedLSN: x.ConfirmedLSN, Unconfirmed: x.Unconfirmed, OldestUnconfirmedAgeSec: x.OldestUnconfirmedAge.Seconds()})
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
	if len(wal) > 0 {
		// In WAL mode the relay deletes a row once the broker confirmed
		// it: the unprocessed rows above are its unconfirmed events, and
		// "processed" counts only the polling side's (scheduled, parked).
		fmt.Fprintln(w)
		fmt.Fprintln(w, "WAL relays (unprocessed above includes their unconfirmed events; processed counts only scheduled and parked rows):")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "SLOT\tDESTINATION\tSTATE\tRETAINED WAL\tCONFIRMED LSN\tUNCONFIRMED\tOLDEST UNCONFIRMED")
		for _, x := range wal {
			state := "standing by (no relay streams)"
			switch {
			case !x.Exists:
				state = "SLOT LOST: run ferry outbox wal-reset"
			case x.WALStatus == "lost":
				state = "INVALIDATED: run ferry outbox wal-reset"
			case x.Active:
				state = "streaming"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d bytes\t%s\t%d\t%s\n", x.Slot, x.Destination, state, x.RetainedBytes, x.ConfirmedLSN, x.Unconfirmed, x.OldestUnconfirmedAge.Round(time.Millisecond))
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

// outboxWALReset is `ferry outbox wal-reset`.
func outboxWALReset(c *cli.Context) error {
	if !c.Bool(flagYes) {
		return usagef("outbox wal-reset forgets the WAL relay's replication slot and hands its unconfirmed events to the polling side (published again, in id order, at least once): add --%s to confirm", flagYes)
	}
	s, log, err := setup(c, "info")
	if err != nil {
		return err
	}
	st, err := openMigratedStack(c.Context, s, log)
	if err != nil {
		return err
	}
	defer st.close()
	slot := s.walSlot
	if slot == "" {
		slot = outbox.DefaultSlotName(s.destination)
	}
	n, err := outbox.ResetWALSlot(c.Context, st.pool, slot, s.destination)
	if err != nil {
		return fmt.Errorf("ferry: %w", err)
	}
	log.Info("outbox wal-reset", "slot", slot, "destination", s.destination, "handed_to_polling", n, "by", operator(), "at", time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(c.App.Writer, "slot %s forgotten; %d unconfirmed event(s) handed to the polling side; the next ferry relay --relay-mode=wal creates a new slot\n", slot, n)
	return nil
}

// walJSON is a WAL relay's slot in `outbox stats --format json`.
type walJSON struct {
	Slot                    string  `json:"slot"`
	Destination             string  `json:"destination"`
	Exists                  bool    `json:"exists"`
	Active                  bool    `json:"active"`
	WALStatus               string  `json:"wal_status"`
	RetainedBytes           int64   `json:"retained_bytes"`
	ConfirmedLSN            string  `json:"confirmed_lsn"`
	Unconfirmed             int64   `json:"unconfirmed"`
	OldestUnconfirmedAgeSec float64 `json:"oldest_unconfirmed_age_seconds"`
}
