package alert

// The leader and persistence layer of Config.Pool: one Alert per database
// leads (session-level advisory lock on a connection taken out of the pool)
// and keeps the state machine's state and undelivered notifications in the
// table ferry_alerts. The state machine itself (advance, deliver) is the same
// as without a Pool.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// LockClassID is the first key of the session-level advisory lock the
// leader holds: pg_try_advisory_lock(LockClassID, LockObjID(Config.Name)).
// It is the bytes "fery"; pg_locks shows it as classid 1717924473.
const LockClassID int32 = 0x66657279

// TableName is the table that keeps the state of the alerts of a database,
// one row per Config.Name. The leader creates it (CREATE TABLE IF NOT
// EXISTS) when it first takes the lead; see createTable for its columns.
const TableName = "ferry_alerts"

// createTable is run by a new leader, under the advisory lock, so two
// processes never race on it. Columns: state is "inactive", "pending" or
// "firing"; since is when the backlog went above the threshold (NULL when
// inactive); checked_at is when a leader last observed the backlog while
// the rule was pending or firing (its staleness decides whether a
// successor may continue a pending incident, see load); fired_at and
// resolved_at are the last transitions; queued maps
// each notifier's key to its undelivered notifications (JSON array of
// Notification, oldest first).
//
// The table is created here rather than by a goose migration of package
// outbox so that the alert package stays usable on its own; moving it into
// outbox/migrations later is compatible (same IF NOT EXISTS shape).
const createTable = `CREATE TABLE IF NOT EXISTS ferry_alerts (
	name        TEXT PRIMARY KEY,
	state       TEXT NOT NULL,
	since       TIMESTAMPTZ,
	fired_at    TIMESTAMPTZ,
	resolved_at TIMESTAMPTZ,
	queued      JSONB NOT NULL DEFAULT '{}',
	updated_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
	checked_at  TIMESTAMPTZ
)`

// addCheckedAt upgrades a table created before checked_at existed.
const addCheckedAt = `ALTER TABLE ferry_alerts ADD COLUMN IF NOT EXISTS checked_at TIMESTAMPTZ`

const upsertState = `INSERT INTO ferry_alerts (name, state, since, fired_at, resolved_at, queued, updated_at, checked_at)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, now(), $7)
ON CONFLICT (name) DO UPDATE SET state = EXCLUDED.state, since = EXCLUDED.since,
	fired_at = EXCLUDED.fired_at, resolved_at = EXCLUDED.resolved_at,
	queued = EXCLUDED.queued, updated_at = EXCLUDED.updated_at, checked_at = EXCLUDED.checked_at`

// minDBTimeout is the least time a database call of the leader layer gets,
// whatever Interval is: a short Interval must not turn a slow query into a
// lost leadership.
const minDBTimeout = 5 * time.Second

// LockObjID is the second key of the leader's advisory lock for the alert
// named name: its 32-bit FNV-1a hash as an int32. Alerts with different
// names elect their leaders independently.
func LockObjID(name string) int32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(name))
	return int32(h.Sum32())
}

// notifierKeys names each notifier's queue in ferry_alerts.queued: its
// String(), with "#2", "#3", ... for repeats, so processes configured with
// the same notifiers in the same order agree on the keys.
func notifierKeys(ns []Notifier) []string {
	seen := map[string]int{}
	keys := make([]string, len(ns))
	for i, n := range ns {
		k := n.String()
		seen[k]++
		if seen[k] > 1 {
			k = fmt.Sprintf("%s#%d", k, seen[k])
		}
		keys[i] = k
	}
	return keys
}

// Leading reports whether this Alert holds the leader lock (always false
// without Config.Pool).
func (a *Alert) Leading() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lockConn != nil
}

// Close gives up the leadership, if this Alert holds it, by closing the
// connection that holds the advisory lock; another process's Alert takes
// over at its next check. The state stays in ferry_alerts. Run calls Close
// before it returns; a later Check or Run takes part in the election again.
// Without Config.Pool it does nothing. It returns the error of closing the
// connection (the lock is released by the server either way).
func (a *Alert) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.lockConn == nil {
		return nil
	}
	// Unlock first: the server releases a closed session's locks only
	// when its backend exits, a moment after the client has gone, and a
	// successor should not have to wait a tick for that.
	ctx, cancel := context.WithTimeout(context.Background(), minDBTimeout)
	_, uerr := a.lockConn.Exec(ctx, `SELECT pg_advisory_unlock($1, $2)`, LockClassID, a.lockID)
	cancel()
	err := errors.Join(uerr, a.closeLockConn())
	a.reset()
	a.log().Info("alert: leadership released")
	return err
}

func (a *Alert) dbTimeout() time.Duration { return max(a.cfg.Interval, minDBTimeout) }

// leaderIdleTimeout is the leader session's idle_session_timeout: longer
// than the gap between two pings of a live leader (a tick: Source, one
// notification per notifier, two saves), at least a minute.
func (a *Alert) leaderIdleTimeout() time.Duration {
	tick := a.cfg.Interval + a.cfg.Interval + 3*a.dbTimeout() + time.Duration(len(a.cfg.Notifiers))*a.cfg.NotifyTimeout
	return max(time.Minute, 2*tick)
}

// lead makes sure this Alert leads: it checks the lock's connection when it
// holds the lock, and otherwise tries to take it. a.mu is held.
func (a *Alert) lead(ctx context.Context) bool {
	if a.lockConn != nil {
		cctx, cancel := context.WithTimeout(ctx, a.dbTimeout())
		err := a.lockConn.Ping(cctx)
		cancel()
		if err == nil {
			return true
		}
		if ctx.Err() != nil { // stopping: the cancelled ping broke the connection
			_ = a.closeLockConn()
			a.reset()
			return false
		}
		a.lose("the connection holding the leader lock failed", err)
	}
	return a.acquire(ctx)
}

// acquire tries the advisory lock on a pool connection; on success it takes
// the connection out of the pool (the session holds the lock) and loads the
// stored state. a.mu is held.
func (a *Alert) acquire(ctx context.Context) bool {
	cctx, cancel := context.WithTimeout(ctx, a.dbTimeout())
	defer cancel()
	pc, err := a.cfg.Pool.Acquire(cctx)
	if err != nil {
		if ctx.Err() == nil {
			a.log().Warn("alert: cannot try the leader lock; retrying on the next check", "err", err)
		}
		return false
	}
	var got bool
	err = pc.QueryRow(cctx, `SELECT pg_try_advisory_lock($1, $2)`, LockClassID, a.lockID).Scan(&got)
	if err != nil || !got {
		// Not the leader: the connection goes back to the pool holding no
		// lock. (A failed query closes it, which also releases any lock.)
		pc.Release()
		if err != nil && ctx.Err() == nil {
			a.log().Warn("alert: cannot try the leader lock; retrying on the next check", "err", err)
		}
		return false
	}
	a.lockConn = pc.Hijack()
	// A leader whose host died or was cut off sends no FIN; without this
	// the server would keep its session, and the lock, until TCP
	// keepalive gives up (hours by default). The leader pings every
	// Interval, so a live one never idles that long. PostgreSQL 14+; on an
	// older server the lock is held until TCP notices.
	if _, err := a.lockConn.Exec(cctx, fmt.Sprintf("SET idle_session_timeout = %d", a.leaderIdleTimeout().Milliseconds())); err != nil {
		a.log().Warn("alert: cannot set idle_session_timeout on the leader connection; a vanished leader keeps the lock until TCP gives up", "err", err)
		if a.lockConn.IsClosed() {
			a.lose("the connection holding the leader lock failed", err)
			return false
		}
	}
	if err := a.load(cctx); err != nil {
		a.lose("cannot load the stored alert state", err)
		return false
	}
	a.log().Info("alert: leading (advisory lock taken); continuing from the stored state",
		"state", a.state.String(), "since", a.startsAt, "queued", a.queuedCount())
	return true
}

// load reads this alert's row from ferry_alerts into the state machine,
// creating the table first. a.mu is held.
func (a *Alert) load(ctx context.Context) error {
	if _, err := a.lockConn.Exec(ctx, createTable); err != nil {
		return fmt.Errorf("alert: create table %s: %w", TableName, err)
	}
	if _, err := a.lockConn.Exec(ctx, addCheckedAt); err != nil {
		return fmt.Errorf("alert: add checked_at to %s: %w", TableName, err)
	}
	var (
		state                        string
		since, fired, resol, checked *time.Time
		queued                       map[string][]Notification
	)
	err := a.lockConn.QueryRow(ctx,
		`SELECT state, since, fired_at, resolved_at, queued, checked_at FROM ferry_alerts WHERE name = $1`, a.cfg.Name).
		Scan(&state, &since, &fired, &resol, &queued, &checked)
	a.reset()
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("alert: read %s: %w", TableName, err)
	}
	switch state {
	case Inactive.String():
		a.state = Inactive
	case Pending.String():
		a.state = Pending
	case Firing.String():
		a.state = Firing
	default:
		a.log().Error("alert: unknown stored state; starting from inactive", "stored_state", state)
		a.dirty = true
	}
	if since != nil {
		a.startsAt = *since
	} else if a.state != Inactive {
		// A pending or firing row without since: measure from now.
		a.startsAt = a.cfg.Now()
		a.dirty = true
	}
	if a.state == Pending {
		// A pending incident continues only if some leader watched the
		// backlog until recently; otherwise nobody knows whether it stayed
		// above the threshold in between (the relay that wrote it may be
		// long gone, the backlog may have been 0 for hours), so it is
		// re-evaluated from now instead of firing on trust.
		if age, ok := a.staleness(checked); !ok {
			a.log().Warn("alert: stored pending state is stale; re-evaluating the backlog from now",
				"since", a.startsAt, "last_checked_ago", age, "stale_after", a.staleAfter())
			a.state = Inactive
			a.startsAt = time.Time{}
			a.dirty = true
		}
	}
	if checked != nil {
		a.checkedAt = *checked
	}
	if fired != nil {
		a.firedAt = *fired
	}
	if resol != nil {
		a.resolvedAt = *resol
	}
	for i, k := range a.keys {
		q := queued[k]
		delete(queued, k)
		if len(q) > MaxQueued {
			a.log().Error("alert: stored notifier queue too long; dropping the oldest undelivered notifications",
				"notifier", k, "dropped", len(q)-MaxQueued)
			q = q[len(q)-MaxQueued:]
			a.dirty = true
		}
		a.queues[i] = q
	}
	for k, q := range queued {
		if len(q) > 0 {
			a.log().Error("alert: dropping undelivered notifications of a notifier this process does not have; configure the same notifiers on every process",
				"notifier", k, "dropped", len(q))
			a.dirty = true
		}
	}
	return nil
}

// save writes the state and the queues when they changed. It runs even
// when ctx is cancelled (bounded by dbTimeout), so a process that is
// stopping still records its last transition. On failure the leadership is
// given up (the write goes through the lock's connection, so it cannot
// succeed once the lock is lost). a.mu is held.
func (a *Alert) save(ctx context.Context) bool {
	if !a.dirty {
		return true
	}
	if a.lockConn == nil {
		return false
	}
	queued := make(map[string][]Notification, len(a.keys))
	for i, k := range a.keys {
		if len(a.queues[i]) > 0 {
			queued[k] = a.queues[i]
		}
	}
	js, err := json.Marshal(queued)
	if err != nil {
		a.lose("cannot encode the notification queues", err)
		return false
	}
	var since *time.Time
	if a.state != Inactive {
		since = &a.startsAt
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.dbTimeout())
	defer cancel()
	_, err = a.lockConn.Exec(cctx, upsertState, a.cfg.Name, a.state.String(), since,
		nullTime(a.firedAt), nullTime(a.resolvedAt), string(js), nullTime(a.checkedAt))
	if err != nil {
		a.lose("cannot save the alert state", err)
		return false
	}
	a.dirty = false
	return true
}

// lose gives up the leadership after a failure. a.mu is held.
func (a *Alert) lose(reason string, err error) {
	_ = a.closeLockConn()
	a.reset()
	a.log().Warn("alert: leadership lost: "+reason+"; retrying on the next check", "err", err)
}

func (a *Alert) closeLockConn() error {
	if a.lockConn == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), minDBTimeout)
	defer cancel()
	err := a.lockConn.Close(ctx)
	a.lockConn = nil
	return err
}

// reset forgets the in-memory state; the stored state is what a leader
// continues from. a.mu is held.
// staleAfter is how old a stored pending state may be (since it was last
// checked) and still be continued: a successor takes the lock at the
// latest leaderIdleTimeout after a leader vanished, plus two ticks.
func (a *Alert) staleAfter() time.Duration {
	return a.leaderIdleTimeout() + 2*a.cfg.Interval
}

// staleness returns how long ago checked was (on the Alert's clock) and
// whether that is recent enough to continue from; a missing checked_at
// (a row written before the column existed) is stale.
func (a *Alert) staleness(checked *time.Time) (time.Duration, bool) {
	if checked == nil {
		return -1, false
	}
	age := a.cfg.Now().Sub(*checked)
	return age, age <= a.staleAfter()
}

func (a *Alert) reset() {
	a.state = Inactive
	a.startsAt, a.firedAt, a.resolvedAt, a.checkedAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	for i := range a.queues {
		a.queues[i] = nil
	}
	a.dirty = false
}

func (a *Alert) queuedCount() int {
	n := 0
	for _, q := range a.queues {
		n += len(q)
	}
	return n
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// Stored is an alert's state as its leader last wrote it to ferry_alerts,
// for a process that does not run the alert (the web console, an
// operator's tool).
type Stored struct {
	// Name is the alert's name (Config.Name).
	Name string
	// State is the rule's state when the leader last wrote it.
	State State
	// Since is when the backlog went above the threshold; zero when
	// Inactive.
	Since time.Time
	// FiredAt and ResolvedAt are the last firing and resolved
	// transitions; zero when there was none.
	FiredAt, ResolvedAt time.Time
	// UpdatedAt is when a leader last wrote the row (the database
	// server's clock); a leader writes it on every transition, and every
	// Interval while Pending or Firing. Zero when no row was stored (a
	// leader that has only seen the backlog at or below the threshold
	// stores nothing).
	UpdatedAt time.Time
	// Leader reports whether a process holds the alert's leader lock now
	// (pg_locks: the advisory lock LockClassID, LockObjID(Name)), that
	// is whether some relay on this database runs the alert.
	Leader bool
}

// leaderHeld reports whether a session holds the leader lock of the alert
// named name on the current database. pg_locks shows the two int4 keys of
// pg_try_advisory_lock(int4, int4) as classid and objid (oids, so the
// keys' unsigned values) with objsubid 2.
const leaderHeld = `SELECT EXISTS (SELECT 1 FROM pg_locks
	WHERE locktype = 'advisory' AND granted AND objsubid = 2
	AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND classid = $1::bigint::oid AND objid = $2::bigint::oid)`

// ReadStored returns the state of the alert named name (DefaultName when
// empty) that a leader on pool's database last stored, and whether a
// leader runs now (Stored.Leader). found is false, with a nil error,
// when no leader has stored a state (the table ferry_alerts or its row
// does not exist): the rule is then Inactive if st.Leader, not run at
// all otherwise. Errors are the database's, wrapped.
func ReadStored(ctx context.Context, pool *pgxpool.Pool, name string) (st Stored, found bool, err error) {
	if name == "" {
		name = DefaultName
	}
	st.Name = name
	if err := pool.QueryRow(ctx, leaderHeld, int64(uint32(LockClassID)), int64(uint32(LockObjID(name)))).Scan(&st.Leader); err != nil {
		return Stored{}, false, fmt.Errorf("alert: read the leader lock: %w", err)
	}
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, TableName).Scan(&exists); err != nil {
		return Stored{}, false, fmt.Errorf("alert: read %s: %w", TableName, err)
	}
	if !exists {
		return st, false, nil
	}
	var (
		state                  string
		since, fired, resolved *time.Time
	)
	err = pool.QueryRow(ctx, `SELECT state, since, fired_at, resolved_at, updated_at FROM ferry_alerts WHERE name = $1`, name).
		Scan(&state, &since, &fired, &resolved, &st.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, false, nil
	}
	if err != nil {
		return Stored{}, false, fmt.Errorf("alert: read %s: %w", TableName, err)
	}
	switch state {
	case "pending":
		st.State = Pending
	case "firing":
		st.State = Firing
	default:
		st.State = Inactive
	}
	for _, p := range []struct {
		dst *time.Time
		src *time.Time
	}{{&st.Since, since}, {&st.FiredAt, fired}, {&st.ResolvedAt, resolved}} {
		if p.src != nil {
			*p.dst = *p.src
		}
	}
	return st, true, nil
}
