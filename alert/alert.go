package alert

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults applied to zero Config fields.
const (
	// DefaultThreshold is the unprocessed-row count the outbox must stay
	// above (strictly) for the alert to fire.
	DefaultThreshold = 100
	// DefaultFor is how long the count must stay above the threshold.
	DefaultFor = 5 * time.Minute
	// DefaultInterval is the check period.
	DefaultInterval = 15 * time.Second
	// DefaultNotifyTimeout bounds one notification attempt.
	DefaultNotifyTimeout = 10 * time.Second
	// DefaultName is the alert name, the same as the Prometheus rule's.
	DefaultName = "FerryOutboxStuck"
	// MaxQueued is how many undelivered notifications one notifier holds;
	// when a new one would exceed it the oldest is dropped (logged at ERROR).
	MaxQueued = 16
)

// The errors that are part of the API.
var (
	// ErrConfig is wrapped by every error New returns for a bad Config.
	ErrConfig = errors.New("alert: invalid config")
	// ErrNotify is wrapped by a notifier's error when the receiver answered
	// but refused the notification (non-2xx status, Telegram "ok": false).
	ErrNotify = errors.New("alert: notification refused")
)

// Source reports the outbox backlog: the number of unprocessed rows and the
// age of the oldest unprocessed row (0 when there is none). It is called once
// per Interval with a context bounded by Interval. outbox.Stats fits it with
// a small adapter.
type Source func(ctx context.Context) (count int, oldest time.Duration, err error)

// State is the state of the alert rule.
type State int

// The states of the rule, as in Prometheus.
const (
	// Inactive: the count is at or below the threshold.
	Inactive State = iota
	// Pending: the count is above the threshold, For has not elapsed yet.
	Pending
	// Firing: the count has been above the threshold for at least For.
	Firing
)

// String returns "inactive", "pending" or "firing".
func (s State) String() string {
	switch s {
	case Inactive:
		return "inactive"
	case Pending:
		return "pending"
	case Firing:
		return "firing"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Notification statuses.
const (
	StatusFiring   = "firing"
	StatusResolved = "resolved"
)

// Notification is what a Notifier sends; the webhook posts it as JSON.
type Notification struct {
	// Alert is the alert name, Config.Name.
	Alert string `json:"alert"`
	// Status is StatusFiring or StatusResolved.
	Status string `json:"status"`
	// Count is the number of unprocessed outbox rows at the transition.
	Count int `json:"unprocessed_rows"`
	// OldestAgeSeconds is the age of the oldest unprocessed row (seconds).
	OldestAgeSeconds float64 `json:"oldest_unprocessed_age_seconds"`
	// Threshold is Config.Threshold.
	Threshold int `json:"threshold"`
	// ForSeconds is Config.For in seconds.
	ForSeconds float64 `json:"for_seconds"`
	// StartsAt is when the count first went above the threshold.
	StartsAt time.Time `json:"starts_at"`
	// At is when the transition (firing or resolved) happened.
	At time.Time `json:"at"`
	// Labels are Config.Labels (e.g. broker, role, instance).
	Labels map[string]string `json:"labels,omitempty"`
	// Summary is a one-line human-readable description.
	Summary string `json:"summary"`
}

// Notifier sends a Notification somewhere. Notify must honour ctx and
// return an error (never panic) when the notification was not accepted; it
// is then retried on the next tick. Notify is called from one goroutine at
// a time per Alert.
type Notifier interface {
	Notify(ctx context.Context, n Notification) error
	// String names the target for logs. It must not contain secrets.
	String() string
}

// Config configures an Alert. Zero fields take the documented defaults.
type Config struct {
	// Threshold: the alert fires when the unprocessed count is strictly
	// above it for For. Defaults to 100. Must not be negative.
	Threshold int
	// For is how long the count must stay above Threshold. Defaults to 5m.
	// Must not be negative.
	For time.Duration
	// Interval is the check period. Defaults to 15s. Must not be negative.
	Interval time.Duration
	// NotifyTimeout bounds one Notify call. Defaults to 10s.
	NotifyTimeout time.Duration
	// Notifiers receive the firing and resolved notifications. May be
	// empty: the alert then only logs.
	Notifiers []Notifier
	// Logger receives the ERROR log when the alert fires and the logs of
	// failures. Defaults to slog.Default().
	Logger *slog.Logger
	// Source reports the backlog. Required.
	Source Source
	// Name is the alert name. Defaults to "FerryOutboxStuck".
	Name string
	// Labels are copied into every Notification and log line, e.g.
	// {"broker": "rabbitmq", "role": "relay"}. Optional.
	Labels map[string]string
	// Now is the clock. Defaults to time.Now; tests inject a fake one.
	Now func() time.Time
	// Pool makes the alert one per database instead of one per process.
	// With a Pool, the Alerts of all processes on that database elect one
	// leader through a PostgreSQL session-level advisory lock, and only the
	// leader reads the Source, moves the state machine and notifies; its
	// state and undelivered notifications live in the table ferry_alerts,
	// so a new leader continues where the old one stopped (see the package
	// documentation, "One alert per database"). Optional: nil keeps the
	// state in this process only, so every process with an Alert notifies
	// on its own and a stopped process forgets a firing alert. The leader
	// takes one connection out of the pool while it leads; the pool's
	// user needs the right to create the table the first time.
	Pool *pgxpool.Pool
}

func (c Config) withDefaults() (Config, error) {
	if c.Source == nil {
		return c, fmt.Errorf("%w: Source is required", ErrConfig)
	}
	if c.Threshold < 0 {
		return c, fmt.Errorf("%w: Threshold %d: must not be negative", ErrConfig, c.Threshold)
	}
	if c.For < 0 {
		return c, fmt.Errorf("%w: For %s: must not be negative", ErrConfig, c.For)
	}
	if c.Interval < 0 {
		return c, fmt.Errorf("%w: Interval %s: must not be negative", ErrConfig, c.Interval)
	}
	if c.NotifyTimeout < 0 {
		return c, fmt.Errorf("%w: NotifyTimeout %s: must not be negative", ErrConfig, c.NotifyTimeout)
	}
	for i, n := range c.Notifiers {
		if n == nil {
			return c, fmt.Errorf("%w: Notifiers[%d] is nil", ErrConfig, i)
		}
	}
	if c.Threshold == 0 {
		c.Threshold = DefaultThreshold
	}
	if c.For == 0 {
		c.For = DefaultFor
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.NotifyTimeout == 0 {
		c.NotifyTimeout = DefaultNotifyTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	c.Labels = maps.Clone(c.Labels)
	c.Notifiers = append([]Notifier(nil), c.Notifiers...)
	return c, nil
}

// Alert is the stuck-outbox alert rule with its notification queues. Its
// methods may be called concurrently.
type Alert struct {
	cfg Config

	mu         sync.Mutex
	state      State
	startsAt   time.Time
	firedAt    time.Time        // last firing transition, kept in ferry_alerts
	resolvedAt time.Time        // last resolved transition, kept in ferry_alerts
	checkedAt  time.Time        // last observation while pending or firing, kept in ferry_alerts
	queues     [][]Notification // one per notifier, oldest first
	dirty      bool             // state or queues changed since the last save (Pool only)
	lockConn   *pgx.Conn        // held while leading (Pool only)
	keys       []string         // notifier keys in ferry_alerts.queued (Pool only)
	lockID     int32            // advisory lock objid (Pool only)
}

// New validates cfg and returns an Alert in state Inactive. Errors wrap
// ErrConfig and name the field.
func New(cfg Config) (*Alert, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	a := &Alert{cfg: c, queues: make([][]Notification, len(c.Notifiers))}
	if c.Pool != nil {
		a.keys = notifierKeys(c.Notifiers)
		a.lockID = LockObjID(c.Name)
	}
	return a, nil
}

// Config returns the configuration with defaults applied.
func (a *Alert) Config() Config { return a.cfg }

// State returns the current state of the rule. With Config.Pool, an Alert
// that is not the leader reports Inactive: it evaluates nothing.
func (a *Alert) State() State {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.state
}

// Run checks the rule at once and then every Interval until ctx is done,
// and returns ctx.Err(). A notification being sent when ctx is done is
// finished first (at most NotifyTimeout). Failures of the Source, of notifiers and (with
// Config.Pool) of the database are logged, never returned. With
// Config.Pool, every check of a non-leader tries to become the leader, and
// Run gives up the leadership (Close) before it returns.
func (a *Alert) Run(ctx context.Context) error {
	t := time.NewTicker(a.cfg.Interval)
	defer t.Stop()
	defer a.Close()
	for {
		a.Check(ctx)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Check runs one evaluation: it asks the Source, advances the state machine
// at the clock's current time, and delivers the notifications queued for
// each notifier (a transition's own and earlier undelivered ones). It
// returns the state after the evaluation. Run calls it every Interval;
// tests call it directly with a fake clock.
//
// With Config.Pool, Check first makes sure this Alert leads (it tries the
// advisory lock when it does not, and loads the stored state when it gets
// it; it checks the lock's connection when it does); a non-leader returns
// Inactive without asking the Source. The leader saves the state and the
// notification queues to ferry_alerts after the transition and before
// delivering, and again after delivering.
func (a *Alert) Check(ctx context.Context) State {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ctx.Err() != nil {
		return a.state
	}
	if a.cfg.Pool != nil && !a.lead(ctx) {
		return a.state
	}
	sctx, cancel := context.WithTimeout(ctx, a.cfg.Interval)
	count, oldest, err := a.cfg.Source(sctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			a.log().Error("alert: cannot read outbox backlog; state unchanged",
				"state", a.state.String(), "err", err)
		}
	} else {
		a.advance(count, oldest)
		if a.cfg.Pool != nil && a.state != Inactive {
			// The heartbeat a successor judges a stored pending state by.
			a.checkedAt = a.cfg.Now().Round(0).Truncate(time.Microsecond)
			a.dirty = true
		}
	}
	// Record the transition and its notifications before sending them, so
	// a leader that dies while sending leaves them to its successor.
	if a.cfg.Pool != nil && !a.save(ctx) {
		return a.state
	}
	a.deliver(ctx)
	if a.cfg.Pool != nil {
		a.save(ctx)
	}
	return a.state
}

// advance moves the state machine for one observation. a.mu is held.
func (a *Alert) advance(count int, oldest time.Duration) {
	now := a.cfg.Now()
	if a.cfg.Pool != nil {
		// The times go through TIMESTAMPTZ (microseconds); a successor's
		// "resolved" must carry the very StartsAt of the "firing".
		now = now.Round(0).Truncate(time.Microsecond)
	}
	above := count > a.cfg.Threshold
	switch a.state {
	case Inactive:
		if !above {
			return
		}
		a.state = Pending
		a.startsAt = now
		a.dirty = true
		a.log().Warn("alert: outbox backlog above threshold; pending",
			"unprocessed_rows", count, "threshold", a.cfg.Threshold, "for", a.cfg.For)
		a.maybeFire(now, count, oldest)
	case Pending:
		if !above {
			a.state = Inactive
			a.dirty = true
			a.log().Info("alert: outbox backlog back under threshold before For elapsed",
				"unprocessed_rows", count, "threshold", a.cfg.Threshold)
			return
		}
		a.maybeFire(now, count, oldest)
	case Firing:
		if above {
			return
		}
		a.state = Inactive
		a.resolvedAt = now
		a.dirty = true
		n := a.notification(StatusResolved, now, count, oldest)
		a.log().Info("alert: resolved: "+n.Summary,
			"unprocessed_rows", count, "threshold", a.cfg.Threshold,
			"oldest_unprocessed_age", oldest, "starts_at", a.startsAt)
		a.enqueue(n)
	}
}

func (a *Alert) maybeFire(now time.Time, count int, oldest time.Duration) {
	if now.Sub(a.startsAt) < a.cfg.For {
		return
	}
	a.state = Firing
	a.firedAt = now
	a.dirty = true
	n := a.notification(StatusFiring, now, count, oldest)
	a.log().Error("alert: firing: "+n.Summary,
		"unprocessed_rows", count, "threshold", a.cfg.Threshold, "for", a.cfg.For,
		"oldest_unprocessed_age", oldest, "starts_at", a.startsAt)
	a.enqueue(n)
}

func (a *Alert) notification(status string, now time.Time, count int, oldest time.Duration) Notification {
	n := Notification{
		Alert:            a.cfg.Name,
		Status:           status,
		Count:            count,
		OldestAgeSeconds: oldest.Seconds(),
		Threshold:        a.cfg.Threshold,
		ForSeconds:       a.cfg.For.Seconds(),
		StartsAt:         a.startsAt,
		At:               now,
		Labels:           maps.Clone(a.cfg.Labels),
	}
	if status == StatusFiring {
		n.Summary = fmt.Sprintf("%d unprocessed outbox rows, above %d for %s; oldest row %s old",
			count, a.cfg.Threshold, now.Sub(a.startsAt).Round(time.Second), oldest.Round(time.Second))
	} else {
		n.Summary = fmt.Sprintf("%d unprocessed outbox rows, at or below %d again after %s",
			count, a.cfg.Threshold, now.Sub(a.startsAt).Round(time.Second))
	}
	return n
}

func (a *Alert) enqueue(n Notification) {
	for i := range a.queues {
		if len(a.queues[i]) >= MaxQueued {
			a.log().Error("alert: notifier queue full; dropping the oldest undelivered notification",
				"notifier", a.cfg.Notifiers[i].String(), "dropped_status", a.queues[i][0].Status,
				"dropped_at", a.queues[i][0].At)
			a.queues[i] = a.queues[i][1:]
		}
		a.queues[i] = append(a.queues[i], n)
		a.dirty = true
	}
}

// deliver sends each notifier's queue in order, stopping at its first
// failure. a.mu is held.
func (a *Alert) deliver(ctx context.Context) {
	for i, nt := range a.cfg.Notifiers {
		for len(a.queues[i]) > 0 {
			if ctx.Err() != nil {
				return
			}
			n := a.queues[i][0]
			err := a.notify(ctx, nt, n)
			if err != nil {
				a.log().Error("alert: notification failed; retrying on the next check",
					"notifier", nt.String(), "status", n.Status, "err", err)
				break
			}
			a.queues[i] = a.queues[i][1:]
			a.dirty = true
		}
	}
}

func (a *Alert) notify(ctx context.Context, nt Notifier, n Notification) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("alert: notifier %s panicked: %v", nt.String(), r)
		}
	}()
	// A send already started is finished even when ctx is cancelled (a
	// stopping process), bounded by NotifyTimeout: cut off, the receiver
	// may have the notification while this side records it as undelivered,
	// and it would be sent again.
	nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.NotifyTimeout)
	defer cancel()
	return nt.Notify(nctx, n)
}

func (a *Alert) log() *slog.Logger {
	l := a.cfg.Logger.With("alert", a.cfg.Name)
	for _, k := range slices.Sorted(maps.Keys(a.cfg.Labels)) {
		l = l.With(k, a.cfg.Labels[k])
	}
	return l
}
