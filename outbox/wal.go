package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ferrymq/ferry/broker"
)

// The relay modes (RelayConfig.Mode).
const (
	// RelayModePoll claims the outbox rows with SELECT ... FOR UPDATE SKIP
	// LOCKED and marks them processed (relay.go): the default.
	RelayModePoll = "poll"
	// RelayModeWAL reads the outbox rows' inserts from PostgreSQL's WAL by
	// logical replication (pgoutput, a publication and a slot of its own)
	// in commit order, publishes them and deletes them once the broker
	// confirmed them; see the package documentation, "WAL relay".
	RelayModeWAL = "wal"
)

// DefaultStatusInterval is RelayConfig.StatusInterval's default.
const DefaultStatusInterval = time.Second

// DefaultSettleInterval is RelayConfig.SettleInterval's default.
const DefaultSettleInterval = 50 * time.Millisecond

// MaxSettleInterval bounds RelayConfig.SettleInterval: the slot's
// position, and with it the WAL the server keeps, trails the broker by at
// most this much.
const MaxSettleInterval = 10 * time.Second

// MaxSlotNameBytes bounds RelayConfig.Slot: PostgreSQL's NAMEDATALEN-1.
const MaxSlotNameBytes = 63

var (
	// ErrWALUnavailable is returned by Relay.Run in WAL mode when the
	// database cannot stream its WAL to the relay; the message names the
	// setting to change (wal_level, max_replication_slots, max_wal_senders,
	// the role's REPLICATION attribute, a managed service's flag such as
	// rds.logical_replication).
	ErrWALUnavailable = errors.New("outbox: wal relay: the database cannot stream its WAL to the relay")
	// ErrSlotLost is returned by Relay.Run in WAL mode when the relay's
	// replication slot was dropped or invalidated after the relay began
	// streaming from it, on the server (system identifier and WAL
	// timeline) where it was created: the WAL of the events committed
	// meanwhile may be gone, so the relay stops rather than skip them. The
	// message names what to do: ResetWALSlot (`ferry outbox wal-reset`)
	// hands the events not yet confirmed (the outbox rows left, see "WAL
	// relay" in the package documentation) to the polling relay and lets
	// the next start create a new slot. A slot missing after a promote is
	// not ErrSlotLost: logical slots are not replicated to a standby
	// before PostgreSQL 17 (its failover slots), the promoted standby is on
	// a new timeline, and the relay does what ResetWALSlot does by itself
	// and creates a new slot (the package documentation, "A promote").
	// A registration from before migration 11 (no timeline recorded) whose
	// slot is missing is ErrSlotLost too.
	ErrSlotLost = errors.New("outbox: wal relay: replication slot lost")
	// ErrSlotActive is returned by ResetWALSlot when a relay streams from
	// the slot now: resetting under it would hand its unconfirmed events
	// to the polling side while it publishes them too. Stop the WAL relays
	// of the destination first.
	ErrSlotActive = errors.New("outbox: wal reset: a relay streams from the slot")
	// ErrNoSlot is returned by ResetWALSlot when there is neither such a
	// replication slot nor a WAL relay's registration of it: nothing to
	// reset (check --wal-slot and --destination).
	ErrNoSlot = errors.New("outbox: wal reset: no such slot")
)

// DefaultSlotName returns the replication slot (and publication) name of a
// WAL relay of destination d: "ferry_" and d with every byte outside
// [a-z0-9_] replaced by '_' (lower-cased), cut to MaxSlotNameBytes.
func DefaultSlotName(d string) string {
	if d == "" {
		d = DefaultDestination
	}
	var b strings.Builder
	b.WriteString("ferry_")
	for _, c := range []byte(strings.ToLower(d)) {
		if (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' {
			b.WriteByte(c)
		} else {
			b.WriteByte('_')
		}
	}
	s := b.String()
	if len(s) > MaxSlotNameBytes {
		s = s[:MaxSlotNameBytes]
	}
	return s
}

// ValidateSlotName checks a RelayConfig.Slot: 1..MaxSlotNameBytes bytes
// of lower-case letters, digits and '_' (PostgreSQL's rule for
// replication slot names). The error says which rule s breaks.
func ValidateSlotName(s string) error {
	if s == "" || len(s) > MaxSlotNameBytes {
		return fmt.Errorf("want 1..%d bytes", MaxSlotNameBytes)
	}
	for _, c := range []byte(s) {
		if !((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_') {
			return errors.New("want lower-case letters, digits and '_' only (PostgreSQL's rule for slot names)")
		}
	}
	return nil
}

// WALCheck checks that the database of pool lets a WAL relay stream from
// it: wal_level=logical, a free replication slot and WAL sender, and a role
// allowed to replicate. The error wraps ErrWALUnavailable and names each
// setting to change (with the managed services' flags, e.g.
// rds.logical_replication on Amazon RDS), or is the database's error.
func WALCheck(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) error {
	var (
		level                 string
		maxSlots, maxSenders  int
		usedSlots, usedSender int
		canReplicate          bool
		rds, cloudsql, azure  *string
		version               int
		role                  string
	)
	err := q.QueryRow(ctx, `SELECT current_setting('wal_level'),
  current_setting('max_replication_slots')::int, current_setting('max_wal_senders')::int,
  (SELECT count(*) FROM pg_replication_slots)::int, (SELECT count(*) FROM pg_stat_replication)::int,
  (SELECT r.rolreplication OR r.rolsuper FROM pg_roles r WHERE r.rolname = current_user)
    OR EXISTS (SELECT 1 FROM pg_roles g WHERE g.rolname = 'rds_replication' AND pg_has_role(current_user, g.oid, 'MEMBER')),
  current_setting('rds.logical_replication', true), current_setting('cloudsql.logical_decoding', true),
  current_setting('azure.replication_support', true), current_setting('server_version_num')::int, current_user::text`).
		Scan(&level, &maxSlots, &maxSenders, &usedSlots, &usedSender, &canReplicate, &rds, &cloudsql, &azure, &version, &role)
	if err != nil {
		return fmt.Errorf("outbox: wal relay: check the database's settings: %w", err)
	}
	var probs []string
	if version < 150000 {
		probs = append(probs, fmt.Sprintf("PostgreSQL %d.%d: the WAL relay needs 15 or later (publication row filters)", version/10000, version%10000/100))
	}
	if level != "logical" {
		p := fmt.Sprintf("wal_level is %q: set wal_level = logical (postgresql.conf or ALTER SYSTEM) and restart the server", level)
		switch {
		case rds != nil:
			p += fmt.Sprintf("; on Amazon RDS/Aurora set rds.logical_replication = 1 (now %s) in the parameter group and reboot", *rds)
		case cloudsql != nil:
			p += fmt.Sprintf("; on Cloud SQL set the flag cloudsql.logical_decoding = on (now %s)", *cloudsql)
		case azure != nil:
			p += fmt.Sprintf("; on Azure set azure.replication_support = logical (now %s) and restart", *azure)
		}
		probs = append(probs, p)
	}
	if maxSlots == 0 || usedSlots >= maxSlots {
		probs = append(probs, fmt.Sprintf("max_replication_slots is %d with %d in use: raise it (restart needed) or drop unused slots", maxSlots, usedSlots))
	}
	if maxSenders == 0 || usedSender >= maxSenders {
		probs = append(probs, fmt.Sprintf("max_wal_senders is %d with %d in use: raise it (restart needed)", maxSenders, usedSender))
	}
	if !canReplicate {
		p := "the role " + role + " lacks the REPLICATION attribute: ALTER ROLE " + role + " REPLICATION (or log in as a superuser)"
		if rds != nil {
			p += " (on Amazon RDS: GRANT rds_replication TO " + role + ")"
		}
		probs = append(probs, p)
	}
	if len(probs) > 0 {
		return fmt.Errorf("%w: %s", ErrWALUnavailable, strings.Join(probs, "; "))
	}
	return nil
}

// publicationSQL creates the publication of a WAL relay: the inserts into
// the outbox (of the current schema) of its destination that are due at
// once. A scheduled row (next_attempt_at set by Event.DueAt) is not
// published: the polling relay publishes it when due. The row filter
// needs PostgreSQL 15.
func publicationSQL(pub, destination string) string {
	return fmt.Sprintf(`CREATE PUBLICATION %s FOR TABLE outbox WHERE (destination = '%s' AND next_attempt_at IS NULL AND processed_at IS NULL) WITH (publish = 'insert')`,
		pgx.Identifier{pub}.Sanitize(), strings.ReplaceAll(destination, "'", "''"))
}

// walDeleteSQL deletes the confirmed rows read from the WAL: the WAL
// relay's only write per batch (no new row version, no index entry).
const walDeleteSQL = `DELETE FROM outbox WHERE id = ANY($1::bigint[]) AND attempts = 0`

// EnsureSlot creates the replication slot and the publication of a WAL
// relay (RelayConfig.Mode "wal") when they do not exist yet, as Run does
// at its start: the events committed after it returned are in the slot's
// stream (those committed before were handed to the polling side). Call it
// before switching producers over, or in tests before enqueueing. It
// returns ErrSlotLost for a registered slot that was dropped or
// invalidated, ErrWALUnavailable when the database cannot stream (the
// message names the setting), the database's error otherwise, and an
// error in poll mode.
func (r *Relay) EnsureSlot(ctx context.Context) error {
	if r.cfg.Mode != RelayModeWAL {
		return fmt.Errorf("outbox: relay: EnsureSlot: Mode is %q, not %q", r.cfg.Mode, RelayModeWAL)
	}
	for {
		err := r.ensureSlot(ctx)
		if !errors.Is(err, errSlotCreating) {
			return err
		}
		// Another relay is creating it: wait until it registered it.
		if !sleep(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// ensureSlot makes sure the slot and the publication exist; on the first
// start it creates them, registers the slot (outbox_wal_slots, with the
// server's system identifier and timeline) and hands the rows committed
// before the slot to the polling relay. A registered slot that is missing
// on another timeline or system than the one it was registered on was lost
// by a failover (slots are not replicated, see ErrSlotLost): recoverSlot
// hands the rows left to the polling relay and the first-start path
// follows. A registered slot missing on its own timeline, or invalidated,
// is ErrSlotLost. On a standby (a server in recovery) it returns
// errStandby, an outage to wait out.
func (r *Relay) ensureSlot(ctx context.Context) error {
	slot := r.cfg.Slot
	var (
		inRecovery      bool
		registered      bool
		exists          bool
		active          bool
		walStatus       *string
		regSys, regTL   *int64
		sysID, timeline *int64
	)
	// The timeline is the one the current WAL is written on (the first 8
	// hex digits of its file name), not pg_control_checkpoint()'s: after a
	// promote that one stays the old timeline until the first checkpoint
	// on the new one completes. pg_walfile_name cannot run in recovery.
	err := r.cfg.Pool.QueryRow(ctx, `SELECT pg_is_in_recovery(),
  EXISTS (SELECT 1 FROM outbox_wal_slots WHERE slot_name = $1),
  EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()),
  COALESCE((SELECT active FROM pg_replication_slots WHERE slot_name = $1), false),
  (SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1),
  (SELECT system_identifier FROM outbox_wal_slots WHERE slot_name = $1),
  (SELECT timeline_id FROM outbox_wal_slots WHERE slot_name = $1),
  (SELECT system_identifier FROM pg_control_system()),
  CASE WHEN NOT pg_is_in_recovery() THEN ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint END`, slot).
		Scan(&inRecovery, &registered, &exists, &active, &walStatus, &regSys, &regTL, &sysID, &timeline)
	if err != nil {
		return fmt.Errorf("outbox: wal relay: look up slot %q: %w", slot, err)
	}
	if inRecovery {
		// A standby has the registration (replicated) and never the slot:
		// not a lost slot, a server that cannot hold one.
		return errStandby
	}
	lost := func(what string) error {
		return fmt.Errorf("%w: slot %q %s after the relay began streaming from it, so the WAL of the events committed meanwhile may be gone; "+
			"run `ferry outbox wal-reset --wal-slot=%s --yes` (outbox.ResetWALSlot): it hands the events not yet confirmed to the polling relay, and the next start creates a new slot "+
			"(keep the slot from falling behind: max_slot_wal_keep_size, the ferry_outbox_wal_retained_bytes metric)", ErrSlotLost, slot, what, slot)
	}
	movedServer := regTL != nil && regSys != nil && (*regTL != *timeline || *regSys != *sysID)
	switch {
	case registered && !exists && movedServer:
		recovered, err := r.recoverSlot(ctx, *regSys, *regTL, *sysID, *timeline)
		if err != nil {
			return err
		}
		if !recovered {
			// Another relay recovered it first: stand by until it
			// registered the new slot.
			return errSlotCreating
		}
	case registered && !exists && regTL == nil:
		return lost("was dropped (its registration predates migration 11 and says not on which timeline it was created, so a failover cannot be told from a drop)")
	case registered && !exists:
		return lost("was dropped")
	case exists && walStatus != nil && *walStatus == "lost":
		return lost("was invalidated (wal_status lost: it fell behind max_slot_wal_keep_size)")
	case exists && registered:
		if regTL == nil || regSys == nil {
			// Registered before migration 11: say where it lives now, so a
			// failover from here on is recognised.
			if _, err := r.cfg.Pool.Exec(ctx, `UPDATE outbox_wal_slots SET system_identifier = $2, timeline_id = $3 WHERE slot_name = $1 AND timeline_id IS NULL`, slot, *sysID, *timeline); err != nil {
				return fmt.Errorf("outbox: wal relay: record the timeline of slot %q: %w", slot, err)
			}
		}
		return nil
	case exists && active:
		// Another relay is creating it (a slot is consistent only once
		// its creation returned: the rows committed before that are not
		// in its stream, and that relay hands them over when it registers
		// the slot). Stand by.
		return errSlotCreating
	}
	if err := WALCheck(ctx, r.cfg.Pool); err != nil {
		return err
	}
	var otherDB *string
	if err := r.cfg.Pool.QueryRow(ctx, `SELECT database::text FROM pg_replication_slots WHERE slot_name = $1 AND database IS DISTINCT FROM current_database()`, slot).Scan(&otherDB); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("outbox: wal relay: look up slot %q: %w", slot, err)
	}
	if otherDB != nil {
		return fmt.Errorf("%w: the replication slot name %q is taken by database %q on this server (slot names are server-wide): give this relay its own (RelayConfig.Slot, --wal-slot)", ErrWALUnavailable, slot, *otherDB)
	}
	// The publication first: the slot decodes with the publication as it
	// was when each change was written, so it must exist before the slot's
	// consistent point.
	var hasPub bool
	if err := r.cfg.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, slot).Scan(&hasPub); err != nil {
		return fmt.Errorf("outbox: wal relay: look up publication %q: %w", slot, err)
	}
	if !hasPub {
		if _, err := r.cfg.Pool.Exec(ctx, publicationSQL(slot, r.cfg.Destination)); err != nil {
			return fmt.Errorf("outbox: wal relay: create publication %q: %w", slot, err)
		}
	}
	if !exists {
		if _, err := r.cfg.Pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "42710" { // duplicate_object: another relay created it
				return fmt.Errorf("outbox: wal relay: create replication slot %q: %w", slot, err)
			}
		}
	}
	// (A slot that exists unregistered and inactive was created by a
	// relay that died before registering it: its creation completed, so
	// it is consistent, and registering it now is what that relay would
	// have done.)
	//
	// The rows committed before the slot are not in its stream: hand them
	// to the polling relay (a row committed after the slot and before this
	// statement is then published by both: a duplicate with the same
	// message ID, which the workers' dedup absorbs).
	tag, err := r.cfg.Pool.Exec(ctx, `WITH s AS (INSERT INTO outbox_wal_slots (slot_name, destination, publication, system_identifier, timeline_id) VALUES ($1, $2, $1, $3, $4) ON CONFLICT DO NOTHING RETURNING 1)
UPDATE outbox SET next_attempt_at = now() WHERE destination = $2 AND processed_at IS NULL AND next_attempt_at IS NULL AND EXISTS (SELECT 1 FROM s)`, slot, r.cfg.Destination, *sysID, *timeline)
	if err != nil {
		return fmt.Errorf("outbox: wal relay: register slot %q: %w", slot, err)
	}
	r.log.Info("outbox: wal relay: created replication slot and publication", "slot", slot, "handed_to_polling", tag.RowsAffected())
	return nil
}

// errSlotCreating: another relay is creating the slot; stand by.
var errSlotCreating = errors.New("outbox: wal relay: another relay is creating the slot")

// errStandby: the database is a standby (in recovery), which holds no
// logical slot (PostgreSQL 15) and refuses to create one: an outage to
// wait out until the connection string leads to a primary
// (target_session_attrs=read-write in a multi-host URL).
var errStandby = errors.New("outbox: wal relay: the database is a standby (in recovery): waiting for a primary (use target_session_attrs=read-write with several hosts)")

// recoverSlot is the failover path of ensureSlot: the registered slot is
// missing on a server of another timeline or system than the one it was
// created on, so it was lost with the old primary (logical slots are not
// replicated before PostgreSQL 17), not dropped. In one statement it drops
// the registration and hands every row of the destination read from the
// WAL and still in the table to the polling relay, as ResetWALSlot does:
// the WAL relay deletes a row only after the broker confirmed it, so the
// rows left are exactly the unconfirmed ones and none is skipped (a row
// whose delete the old primary had not yet replicated is published again:
// a duplicate with the same message ID). The delete is conditional on the
// registration still naming the old place, so of several relays standing
// by only one recovers (false for the others: another relay did it). The
// caller then creates the slot as on a first start.
func (r *Relay) recoverSlot(ctx context.Context, oldSys, oldTL, sys, tl int64) (bool, error) {
	var recovered bool
	var handed int64
	err := r.cfg.Pool.QueryRow(ctx, `WITH d AS (DELETE FROM outbox_wal_slots WHERE slot_name = $1 AND system_identifier = $3 AND timeline_id = $4
    AND NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1) RETURNING 1),
u AS (UPDATE outbox SET next_attempt_at = now() WHERE destination = $2 AND processed_at IS NULL AND next_attempt_at IS NULL AND EXISTS (SELECT 1 FROM d) RETURNING 1)
SELECT EXISTS (SELECT 1 FROM d), (SELECT count(*) FROM u)`, r.cfg.Slot, r.cfg.Destination, oldSys, oldTL).Scan(&recovered, &handed)
	if err != nil {
		return false, fmt.Errorf("outbox: wal relay: recover slot %q after a failover: %w", r.cfg.Slot, err)
	}
	if recovered {
		r.log.Warn("outbox: wal relay: the replication slot was lost by a failover (a promoted standby, or a restore: logical slots are not replicated before PostgreSQL 17); handed the unconfirmed events to the polling relay and creating a new slot",
			"slot", r.cfg.Slot, "old_timeline", oldTL, "new_timeline", tl, "old_system_identifier", oldSys, "new_system_identifier", sys, "handed_to_polling", handed)
	}
	return recovered, nil
}

// ResetWALSlot is the way back from ErrSlotLost (after a promote the
// relay does the same by itself, see ErrSlotLost): it drops the slot
// registration (and the slot, when it still exists) and hands every outbox
// row of destination read from the WAL and not yet confirmed
// (next_attempt_at NULL, still in the table) to the polling relay, which
// publishes them in id order (a key's events keep their order among
// themselves, not across the reset). The next WAL relay start creates a
// new slot. It returns the number of rows handed over; ErrSlotActive
// (naming the server process) while a relay streams from the slot, with
// nothing changed, and ErrNoSlot when neither the slot nor its
// registration exists.
func ResetWALSlot(ctx context.Context, q interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	QueryRow(context.Context, string, ...any) pgx.Row
}, slot, destination string) (int64, error) {
	if destination == "" {
		destination = DefaultDestination
	}
	if slot == "" {
		slot = DefaultSlotName(destination)
	}
	var exists, active, registered bool
	var pid *int32
	err := q.QueryRow(ctx, `SELECT
	EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1),
	coalesce((SELECT active FROM pg_replication_slots WHERE slot_name = $1), false),
	(SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1),
	EXISTS (SELECT 1 FROM outbox_wal_slots WHERE slot_name = $1)`, slot).Scan(&exists, &active, &pid, &registered)
	if err != nil {
		return 0, fmt.Errorf("outbox: wal reset: read slot %q: %w", slot, err)
	}
	switch {
	case active:
		p := "?"
		if pid != nil {
			p = fmt.Sprint(*pid)
		}
		return 0, fmt.Errorf("%w: slot %q is streamed now (server process %s): stop the WAL relays of destination %q, then reset", ErrSlotActive, slot, p, destination)
	case !exists && !registered:
		return 0, fmt.Errorf("%w: %q (neither a replication slot nor a WAL relay's registration; check --wal-slot and --destination)", ErrNoSlot, slot)
	}
	if exists {
		// NOT active again: a relay that began streaming since the check
		// keeps its slot (the check narrows that race; stopping the
		// relays first, as ErrSlotActive says, closes it).
		if _, err := q.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active`, slot); err != nil {
			return 0, fmt.Errorf("outbox: wal reset: drop slot %q: %w", slot, err)
		}
	}
	tag, err := q.Exec(ctx, `WITH d AS (DELETE FROM outbox_wal_slots WHERE slot_name = $1)
UPDATE outbox SET next_attempt_at = now() WHERE destination = $2 AND processed_at IS NULL AND next_attempt_at IS NULL`, slot, destination)
	if err != nil {
		return 0, fmt.Errorf("outbox: wal reset: %w", err)
	}
	return tag.RowsAffected(), nil
}

// walRun streams the slot until ctx is done or a fatal error (ErrSlotLost,
// ErrWALUnavailable, a closed broker). Outages of the broker or the
// database stop the stream and are waited out with the relay's one
// backoff (awaitAvailable), then the stream restarts from the slot's
// confirmed position.
func (r *Relay) walRun(ctx context.Context) error {
	waitingLogged := false
	for ctx.Err() == nil {
		probe, ok := r.awaitAvailable(ctx)
		if !ok {
			return nil
		}
		res, err := r.walStream(ctx, probe, &waitingLogged)
		if ctx.Err() != nil {
			r.endProbe(probe)
			return nil
		}
		switch {
		case err != nil:
			r.endProbe(probe)
			return err
		case res.fatal:
			r.endProbe(probe)
			r.log.Error("outbox: wal relay: broker closed, stopping", "err", res.err)
			return fmt.Errorf("outbox: relay: %w", res.err)
		case res.outage:
			r.setUnavailable(res, probe)
		default:
			r.endProbe(probe)
			if !sleep(ctx, time.Second) { // the slot is another relay's: wait for it
				return nil
			}
		}
	}
	return nil
}

// walStream runs one replication connection: the reader (this goroutine)
// decodes transactions and answers the server, a publisher goroutine
// publishes and settles them. It returns a batchResult with outage or
// fatal set, or a fatal error, or (zero, nil) when the slot is busy.
func (r *Relay) walStream(ctx context.Context, probe bool, waitingLogged *bool) (batchResult, error) {
	if err := r.ensureSlot(ctx); err != nil {
		if errors.Is(err, ErrSlotLost) || errors.Is(err, ErrWALUnavailable) {
			return batchResult{}, err
		}
		if errors.Is(err, errSlotCreating) {
			return batchResult{}, nil // stand by, try again in a second
		}
		return batchResult{err: err, outage: true, dbFault: true}, nil
	}
	cc := r.cfg.Pool.Config().ConnConfig.Config.Copy()
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	cc.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, cc)
	if err != nil {
		return batchResult{err: fmt.Errorf("outbox: wal relay: connect: %w", err), outage: true, dbFault: true}, nil
	}
	defer r.closeReplication(conn)
	err = pglogrepl.StartReplication(ctx, conn, r.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		// binary: the columns in their binary send format (PostgreSQL 14
		// or later): a third fewer bytes than text for the outbox's rows
		// (no hex bytea, no timestamp text) to send and to decode.
		PluginArgs: []string{"proto_version '1'", "publication_names '" + r.cfg.Slot + "'", "binary 'true'"}})
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			switch pe.Code {
			case "55006": // object_in_use: another relay streams it
				if !*waitingLogged {
					r.log.Info("outbox: wal relay: another relay streams the slot; standing by to take over", "slot", r.cfg.Slot, "detail", pe.Message)
					*waitingLogged = true
				}
				return batchResult{}, nil
			case "42704": // undefined_object: dropped between ensureSlot and here
				// Back through ensureSlot in a second: it tells a drop
				// (ErrSlotLost) from a failover (recovered) or an outage.
				return batchResult{}, nil
			case "55000": // object_not_in_prerequisite_state: invalidated
				return batchResult{}, fmt.Errorf("%w: slot %q: %s; run `ferry outbox wal-reset --wal-slot=%s --yes` (outbox.ResetWALSlot)", ErrSlotLost, r.cfg.Slot, pe.Message, r.cfg.Slot)
			}
		}
		return batchResult{err: fmt.Errorf("outbox: wal relay: start replication: %w", err), outage: true, dbFault: true}, nil
	}
	*waitingLogged = false
	r.log.Info("outbox: wal relay: streaming", "slot", r.cfg.Slot, "destination", r.cfg.Destination)

	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	txs := make(chan *walTx, 64)
	var (
		pubRes  batchResult
		pubDone = make(chan struct{})
	)
	st := &walState{}
	go func() {
		defer close(pubDone)
		pubRes = r.walPublish(sctx, txs, st, probe)
		cancel()
	}()
	rerr := r.walRead(sctx, conn, txs, st)
	cancel()
	<-pubDone
	// Tell the server how far we got before the connection closes.
	if c := st.confirmed.Load(); c != 0 {
		uctx, ucancel := context.WithTimeout(context.Background(), time.Second)
		_ = pglogrepl.SendStandbyStatusUpdate(uctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pglogrepl.LSN(c)})
		ucancel()
	}
	if ctx.Err() != nil {
		return batchResult{}, nil
	}
	if pubRes.outage || pubRes.fatal {
		return pubRes, nil
	}
	if rerr != nil {
		var pe *pgconn.PgError
		if errors.As(rerr, &pe) && (pe.Code == "42704" || pe.Code == "55000") {
			return batchResult{}, fmt.Errorf("%w: slot %q: %s; run `ferry outbox wal-reset --wal-slot=%s --yes` (outbox.ResetWALSlot)", ErrSlotLost, r.cfg.Slot, pe.Message, r.cfg.Slot)
		}
		return batchResult{err: fmt.Errorf("outbox: wal relay: stream: %w", rerr), outage: true, dbFault: true}, nil
	}
	return batchResult{}, nil
}

// closeReplication closes the replication connection and waits (up to 5 s)
// until the server's walsender for it has exited and so released the slot:
// PostgreSQL ends that process asynchronously after the client's Terminate,
// and until then the slot reads as active (pg_replication_slots.active), so
// a standby relay's START_REPLICATION or an operator's ResetWALSlot right
// after Run returned would be refused with "in use". A database that does
// not answer ends the wait early; the server frees the slot on its own.
func (r *Relay) closeReplication(conn *pgconn.PgConn) {
	pid := conn.PID()
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = conn.Close(cctx)
	for {
		var held bool
		err := r.cfg.Pool.QueryRow(cctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND active_pid = $2)`, r.cfg.Slot, int32(pid)).Scan(&held)
		if err != nil || !held {
			return
		}
		select {
		case <-cctx.Done():
			r.log.Warn("outbox: wal relay: the server still holds the slot 5s after the replication connection closed", "slot", r.cfg.Slot, "server_pid", pid)
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// walRead decodes the stream into chunks of transactions for the
// publisher and sends the confirmed position every StatusInterval (and
// when asked). It returns when ctx is done or the stream fails.
//
// A transaction's events are handed over in chunks of up to BatchSize as
// they are decoded, before its commit message is read: without the
// streaming option (which the relay does not ask for) pgoutput is given a
// transaction only once it committed ("the basic output plugin callbacks
// (e.g., begin_cb, change_cb, commit_cb and message_cb) are only invoked
// when the transaction actually commits", PostgreSQL's documentation,
// "Streaming of Large Transactions for Logical Decoding"), so the events
// of a BEGIN already read are committed. A large transaction is thus
// published while the rest of it is read, and never held whole; its last
// chunk carries its end, which the slot confirms once every chunk is
// settled.
func (r *Relay) walRead(ctx context.Context, conn *pgconn.PgConn, txs chan<- *walTx, st *walState) error {
	var (
		rels       = map[uint32]*pglogrepl.RelationMessage{}
		types      = pgtype.NewMap()
		cur        *walTx
		serverEnd  pglogrepl.LSN
		nextStatus = time.Now().Add(r.cfg.StatusInterval)
	)
	status := func() error {
		pos := st.position(serverEnd, cur != nil)
		nextStatus = time.Now().Add(r.cfg.StatusInterval)
		if pos == 0 {
			return nil
		}
		return pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pglogrepl.LSN(pos)})
	}
	for {
		if time.Now().After(nextStatus) {
			if err := status(); err != nil {
				return err
			}
		}
		rctx, cancel := context.WithDeadline(ctx, nextStatus)
		raw, err := conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if pgconn.Timeout(err) {
				continue
			}
			return err
		}
		switch m := raw.(type) {
		case *pgproto3.ErrorResponse:
			return pgconn.ErrorResponseToPgError(m)
		case *pgproto3.CopyData:
			if len(m.Data) == 0 {
				continue
			}
			switch m.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				k, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Data[1:])
				if err != nil {
					return err
				}
				serverEnd = max(serverEnd, k.ServerWALEnd)
				if k.ReplyRequested {
					if err := status(); err != nil {
						return err
					}
				}
			case pglogrepl.XLogDataByteID:
				x, err := pglogrepl.ParseXLogData(m.Data[1:])
				if err != nil {
					return err
				}
				msg, err := pglogrepl.Parse(x.WALData)
				if err != nil {
					return fmt.Errorf("outbox: wal relay: decode: %w", err)
				}
				switch lm := msg.(type) {
				case *pglogrepl.RelationMessage:
					rels[lm.RelationID] = lm
				case *pglogrepl.BeginMessage:
					cur = &walTx{xid: lm.Xid}
				case *pglogrepl.InsertMessage:
					if cur == nil {
						continue
					}
					rel := rels[lm.RelationID]
					if rel == nil {
						return fmt.Errorf("outbox: wal relay: insert into unknown relation %d", lm.RelationID)
					}
					id, m, err := r.walMessage(rel, lm.Tuple, types)
					if err != nil {
						return err
					}
					if m == nil {
						continue
					}
					if len(cur.ids) == r.cfg.BatchSize {
						// A full chunk goes now; the one begun next holds
						// the rest and the end (so never an empty last
						// chunk).
						chunk := cur
						cur = &walTx{xid: chunk.xid}
						if err := r.walHand(ctx, conn, txs, chunk, status); err != nil {
							return err
						}
					}
					cur.ids = append(cur.ids, id)
					cur.msgs = append(cur.msgs, m)
				case *pglogrepl.CommitMessage:
					if cur == nil {
						continue
					}
					tx := cur
					cur = nil
					if len(tx.ids) > 0 {
						tx.end, tx.last = lm.TransactionEndLSN, true
						r.log.Debug("outbox: wal relay: read a transaction", "xid", tx.xid, "events_in_last_chunk", len(tx.ids), "first_id", tx.ids[0], "end", tx.end)
						st.mu.Lock()
						st.received++
						st.mu.Unlock()
						if err := r.walHand(ctx, conn, txs, tx, status); err != nil {
							return err
						}
					}
					serverEnd = max(serverEnd, lm.TransactionEndLSN)
				}
			}
		}
	}
}

// walHand hands a chunk to the publisher, answering the server meanwhile when
// the publisher is behind (so wal_sender_timeout does not end the stream).
func (r *Relay) walHand(ctx context.Context, conn *pgconn.PgConn, txs chan<- *walTx, tx *walTx, status func() error) error {
	t := time.NewTicker(r.cfg.StatusInterval)
	defer t.Stop()
	for {
		select {
		case txs <- tx:
			return nil
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := status(); err != nil {
				return err
			}
		}
	}
}

// walMessage turns an outbox row's insert into the message the polling
// relay would publish for it (same ID, headers, created-at header); nil
// for a row this relay does not publish (another destination, scheduled).
func (r *Relay) walMessage(rel *pglogrepl.RelationMessage, tup *pglogrepl.TupleData, types *pgtype.Map) (int64, *broker.Message, error) {
	if rel.RelationName != "outbox" || tup == nil {
		return 0, nil, nil
	}
	var (
		id      int64
		m       broker.Message
		headers []byte
		occ     time.Time
		skip    bool
	)
	for i, col := range tup.Columns {
		if i >= len(rel.Columns) {
			break
		}
		rc := rel.Columns[i]
		data := col.Data // the decoder's own copy
		isNull := col.DataType == pglogrepl.TupleDataTypeNull
		// The stream asks for the binary format (walStream), but a
		// column may come as text: decode each as it says.
		format := int16(pgtype.TextFormatCode)
		if col.DataType == pglogrepl.TupleDataTypeBinary {
			format = pgtype.BinaryFormatCode
		}
		var err error
		switch rc.Name {
		case "id":
			err = types.Scan(pgtype.Int8OID, format, data, &id)
		case "event_type": // text: the same bytes in both formats
			m.Type = string(data)
		case "partition_key":
			m.Key = string(data)
		case "payload":
			if format == pgtype.BinaryFormatCode {
				m.Body = data
			} else {
				err = types.Scan(pgtype.ByteaOID, format, data, &m.Body)
			}
			if m.Body == nil {
				m.Body = []byte{}
			}
		case "headers":
			headers = data
			if format == pgtype.BinaryFormatCode && len(data) > 0 {
				if data[0] != 1 {
					err = fmt.Errorf("jsonb binary format version %d, want 1", data[0])
				}
				headers = data[1:] // jsonb_send: version 1, then the text
			}
		case "occurred_at":
			err = types.Scan(pgtype.TimestamptzOID, format, data, &occ)
		case "destination":
			skip = skip || string(data) != r.cfg.Destination
		case "next_attempt_at", "processed_at":
			skip = skip || !isNull
		}
		if err != nil {
			return 0, nil, fmt.Errorf("outbox: wal relay: decode column %s: %w", rc.Name, err)
		}
	}
	if skip {
		return 0, nil, nil
	}
	m.ID = strconv.FormatInt(id, 10)
	m.Headers = map[string]string{}
	if len(headers) > 2 {
		if err := json.Unmarshal(headers, &m.Headers); err != nil {
			r.log.Warn("outbox: wal relay: ignoring unreadable headers", "id", id, "err", err)
			m.Headers = map[string]string{}
		}
	}
	m.Headers[broker.HeaderCreatedAt] = broker.FormatTime(occ)
	return id, &m, nil
}

// walVisibleSQL reports whether the transactions $1 (32-bit xids, which
// committed) are all visible in a snapshot taken now: each precedes the
// snapshot's xmax (modulo 2^32; a transaction at or past xmax counts as
// running, and xmax moves past a committing transaction only when it
// leaves the running list) and none is in its list of running ones.
const walVisibleSQL = `WITH s AS (SELECT pg_current_snapshot() AS s),
m AS (SELECT pg_snapshot_xmax(s.s)::text::bigint % 4294967296 AS xmax FROM s)
SELECT NOT EXISTS (SELECT 1 FROM unnest($1::bigint[]) x, m WHERE (x - m.xmax + 4294967296) % 4294967296 < 2147483648)
   AND NOT EXISTS (SELECT 1 FROM s, pg_snapshot_xip(s.s) y WHERE (y::text::bigint % 4294967296) = ANY($1::bigint[]))`

// walAwaitVisible waits until the transactions xids, which the stream
// delivered (so they committed, see walRead), are visible to new
// snapshots. PostgreSQL writes
// and flushes a commit record before the committing backend leaves the
// list of running transactions, so a WAL sender can deliver a transaction
// a moment before its writes are visible to others: a worker handling the
// event at once could then miss the producer's rows (seen in
// BenchmarkEndToEnd: 21 of 10,000 handlers found their notification row
// not yet visible). The poll relay cannot see a row before its
// transaction is visible; this gives the WAL relay the same guarantee, at
// one query per batch (more only in that window, 1 ms apart).
func (r *Relay) walAwaitVisible(ctx context.Context, xids []int64) error {
	for {
		var visible bool
		if err := r.cfg.Pool.QueryRow(ctx, walVisibleSQL, xids).Scan(&visible); err != nil {
			return fmt.Errorf("outbox: wal relay: wait for the transactions to be visible: %w", err)
		}
		if visible {
			return nil
		}
		t := time.NewTimer(time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// WALStats is a snapshot of a WAL relay's slot, for `ferry outbox stats`
// and the metrics.
type WALStats struct {
	// Slot is the replication slot's name; Exists is false when it was
	// not created yet (or was dropped).
	Slot   string
	Exists bool
	// Active reports whether a relay streams from it now (a WAL sender
	// holds it; not while it is being created); ActivePID is the server
	// process holding it (0 when none).
	Active    bool
	ActivePID int
	// WALStatus is pg_replication_slots.wal_status: reserved, extended,
	// unreserved or lost (lost: invalidated, see ErrSlotLost).
	WALStatus string
	// RetainedBytes is the WAL the slot keeps on the server (bytes from
	// its restart_lsn to the current WAL position): it grows while the
	// relay is down or behind.
	RetainedBytes int64
	// ConfirmedLSN is the slot's confirmed position, as text.
	ConfirmedLSN string
	// OldestUnconfirmedAge is the age of the oldest event of this
	// destination read from the WAL (or to be read) and not yet confirmed:
	// the oldest outbox row left with next_attempt_at NULL (the WAL relay
	// deletes a row once confirmed); 0 when none.
	OldestUnconfirmedAge time.Duration
	// Unconfirmed is the number of those rows.
	Unconfirmed int64
}

// ReadWALStats reads the WAL relay's slot and backlog. slot "" means
// DefaultSlotName(destination).
func ReadWALStats(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, slot, destination string) (WALStats, error) {
	if destination == "" {
		destination = DefaultDestination
	}
	if slot == "" {
		slot = DefaultSlotName(destination)
	}
	s := WALStats{Slot: slot}
	var (
		pid    *int32
		status *string
		ret    *int64
		lsn    *string
		age    *float64
	)
	err := q.QueryRow(ctx, `SELECT s.slot_name IS NOT NULL,
  COALESCE(s.active, false) AND EXISTS (SELECT 1 FROM pg_stat_replication w WHERE w.pid = s.active_pid), s.active_pid, s.wal_status,
  pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint, s.confirmed_flush_lsn::text,
  (SELECT extract(epoch FROM now() - min(o.occurred_at)) FROM outbox o WHERE o.destination = $2 AND o.processed_at IS NULL AND o.next_attempt_at IS NULL),
  (SELECT count(*) FROM outbox o WHERE o.destination = $2 AND o.processed_at IS NULL AND o.next_attempt_at IS NULL)
FROM (SELECT 1) one LEFT JOIN pg_replication_slots s ON s.slot_name = $1`, slot, destination).
		Scan(&s.Exists, &s.Active, &pid, &status, &ret, &lsn, &age, &s.Unconfirmed)
	if err != nil {
		return s, fmt.Errorf("outbox: wal stats: %w", err)
	}
	if pid != nil {
		s.ActivePID = int(*pid)
	}
	if status != nil {
		s.WALStatus = *status
	}
	if ret != nil {
		s.RetainedBytes = *ret
	}
	if lsn != nil {
		s.ConfirmedLSN = *lsn
	}
	if age != nil && *age > 0 {
		s.OldestUnconfirmedAge = time.Duration(*age * float64(time.Second))
	}
	return s, nil
}

// WALSlotStats is a WALStats with the destination its slot was created
// for (outbox_wal_slots), for ListWALStats.
type WALSlotStats struct {
	WALStats
	// Destination is the outbox destination the slot's relay publishes.
	Destination string
}

// ListWALStats returns the stats of every slot a WAL relay created on
// this database (outbox_wal_slots), in slot name order; none when no relay
// ran in WAL mode, or before migration 9.
func ListWALStats(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
	QueryRow(context.Context, string, ...any) pgx.Row
}) ([]WALSlotStats, error) {
	var has bool
	if err := q.QueryRow(ctx, `SELECT to_regclass('outbox_wal_slots') IS NOT NULL`).Scan(&has); err != nil || !has {
		return nil, err
	}
	rows, err := q.Query(ctx, `SELECT slot_name, destination FROM outbox_wal_slots ORDER BY slot_name`)
	if err != nil {
		return nil, fmt.Errorf("outbox: wal stats: %w", err)
	}
	type sd struct{ slot, dest string }
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (sd, error) {
		var x sd
		return x, r.Scan(&x.slot, &x.dest)
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: wal stats: %w", err)
	}
	var out []WALSlotStats
	for _, x := range list {
		s, err := ReadWALStats(ctx, q, x.slot, x.dest)
		if err != nil {
			return nil, err
		}
		out = append(out, WALSlotStats{WALStats: s, Destination: x.dest})
	}
	return out, nil
}
