package ferry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/robfig/cron/v3"

	"github.com/ferrymq/ferry/outbox"
)

// PeriodicTable is the table of the periodic jobs' last enqueued ticks,
// one row per PeriodicJob name; package outbox's migrations create it.
const PeriodicTable = "ferry_periodic"

// MaxPeriodicNameBytes bounds a PeriodicJob's name (bytes).
const MaxPeriodicNameBytes = 200

// MinPeriodicInterval is the shortest "@every" interval a schedule may
// have.
const MinPeriodicInterval = time.Second

// Schedule gives the ticks of a periodic job: Next returns the first tick
// strictly after t, or the zero time when there is none. It must be
// deterministic (the same t gives the same tick on every replica), since
// the replicas agree on a tick by its time. It is the interface of
// github.com/robfig/cron/v3's cron.Schedule.
type Schedule interface {
	Next(t time.Time) time.Time
}

// cronParser reads the five standard fields (minute hour day-of-month
// month day-of-week), an optional leading seconds field, and descriptors
// such as "@hourly" and "@daily".
var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// ParseSchedule parses a schedule. It accepts:
//
//   - "@every D", D a time.ParseDuration of at least MinPeriodicInterval
//     (1 s): ticks at the multiples of D since the zero time.Time (for D
//     dividing a day, e.g. 1s, 5m or 1h, at the multiples of D since
//     midnight UTC), so every replica computes the same ticks;
//   - a cron expression read by github.com/robfig/cron/v3's parser: five
//     fields ("*/5 * * * *", minute hour day-of-month month day-of-week),
//     or six with leading seconds ("*/10 * * * * *"), or a descriptor
//     ("@hourly", "@daily", "@weekly", "@monthly", "@yearly"). Its times
//     are in UTC unless the expression starts with "CRON_TZ=Area/City "
//     (an IANA time zone), so that replicas in different local time zones
//     agree.
//
// The error wraps ErrInvalidConfig and quotes the spec.
func ParseSchedule(spec string) (Schedule, error) {
	s := strings.TrimSpace(spec)
	if rest, ok := strings.CutPrefix(s, "@every "); ok {
		d, err := time.ParseDuration(strings.TrimSpace(rest))
		if err != nil {
			return nil, fmt.Errorf("%w: schedule %q: %v", ErrInvalidConfig, spec, err)
		}
		if d < MinPeriodicInterval {
			return nil, fmt.Errorf("%w: schedule %q: interval %v is shorter than %v", ErrInvalidConfig, spec, d, MinPeriodicInterval)
		}
		return every(d), nil
	}
	if s == "" {
		return nil, fmt.Errorf("%w: schedule: empty (want \"@every 1m\" or a cron expression such as \"*/5 * * * *\")", ErrInvalidConfig)
	}
	if !strings.HasPrefix(s, "CRON_TZ=") && !strings.HasPrefix(s, "TZ=") {
		s = "CRON_TZ=UTC " + s
	}
	sched, err := cronParser.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("%w: schedule %q: %v", ErrInvalidConfig, spec, err)
	}
	return sched, nil
}

// every ticks at the multiples of the interval since the zero time.
type every time.Duration

func (e every) Next(t time.Time) time.Time {
	d := time.Duration(e)
	return t.Truncate(d).Add(d)
}

// PeriodicJob is a job enqueued on a schedule, built by Periodic and run
// by a Scheduler (or Config.Periodic of a Pipeline).
type PeriodicJob struct {
	name     string
	spec     string
	schedule Schedule
	event    outbox.Event
}

// Name returns the job's name, its key in PeriodicTable.
func (j *PeriodicJob) Name() string { return j.name }

// Schedule returns the job's parsed schedule.
func (j *PeriodicJob) Schedule() Schedule { return j.schedule }

// Periodic returns a job that enqueues an event of type eventType with
// args (encoded as JSON by NewEvent, as Enqueue does) at each tick of
// schedule (ParseSchedule), e.g. Periodic("nightly-report", "0 3 * * *",
// "report.requested", ReportArgs{}). name identifies the schedule across
// replicas and restarts: 1 to MaxPeriodicNameBytes bytes of valid UTF-8
// without control characters, unique in a database (it is the key of
// PeriodicTable). opts are Enqueue's, except DueAt and DueIn, which a
// periodic job refuses (its tick is its time). Unless WithAppID is given,
// each tick's event has the AppID "<name>@<tick in RFC 3339, UTC>", so
// "ferry dlq list" and the outbox show which tick it is. Errors wrap
// ErrInvalidConfig (a bad name, schedule or option) or
// outbox.ErrInvalidEvent (args that do not encode, an invalid type).
func Periodic[T any](name, schedule, eventType string, args T, opts ...EnqueueOption) (*PeriodicJob, error) {
	switch {
	case name == "":
		return nil, fmt.Errorf("%w: periodic job: name is empty", ErrInvalidConfig)
	case len(name) > MaxPeriodicNameBytes || !utf8.ValidString(name) ||
		strings.ContainsFunc(name, func(r rune) bool { return r < ' ' || r == 0x7f }):
		return nil, fmt.Errorf("%w: periodic job %q: name must be at most %d bytes of valid UTF-8 without control characters", ErrInvalidConfig, clip(name), MaxPeriodicNameBytes)
	}
	sched, err := ParseSchedule(schedule)
	if err != nil {
		return nil, fmt.Errorf("periodic job %q: %w", name, err)
	}
	e, err := NewEvent(eventType, args, opts...)
	if err != nil {
		return nil, fmt.Errorf("periodic job %q: %w", name, err)
	}
	if !e.DueAt.IsZero() {
		return nil, fmt.Errorf("%w: periodic job %q: DueAt/DueIn: a periodic job is enqueued at its ticks, not scheduled", ErrInvalidConfig, name)
	}
	return &PeriodicJob{name: name, spec: schedule, schedule: sched, event: e}, nil
}

func clip(s string) string {
	if len(s) <= 64 {
		return s
	}
	return strings.ToValidUTF8(s[:64], "") + "..."
}

// SchedulerConfig configures a Scheduler.
type SchedulerConfig struct {
	// Pool is the database of the outbox and PeriodicTable
	// (outbox.Migrate). Required.
	Pool *pgxpool.Pool
	// Jobs are the periodic jobs to run; their names must be distinct.
	// Required (at least one).
	Jobs []*PeriodicJob
	// Logger receives the logs. Defaults to slog.Default().
	Logger *slog.Logger
}

// Scheduler enqueues its periodic jobs at their ticks. Run one in every
// replica of a service: across any number of Schedulers on one database
// each tick of a job is enqueued exactly once (see the package doc,
// "Periodic jobs"). Create it with NewScheduler.
type Scheduler struct {
	cfg SchedulerConfig
	log *slog.Logger
}

// NewScheduler validates cfg. The error wraps ErrInvalidConfig and names
// the field.
func NewScheduler(cfg SchedulerConfig) (*Scheduler, error) {
	if cfg.Pool == nil {
		return nil, fmt.Errorf("%w: SchedulerConfig.Pool: required", ErrInvalidConfig)
	}
	if err := validateJobs("SchedulerConfig.Jobs", cfg.Jobs); err != nil {
		return nil, err
	}
	if len(cfg.Jobs) == 0 {
		return nil, fmt.Errorf("%w: SchedulerConfig.Jobs: empty", ErrInvalidConfig)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Scheduler{cfg: cfg, log: cfg.Logger}, nil
}

func validateJobs(field string, jobs []*PeriodicJob) error {
	names := map[string]bool{}
	for i, j := range jobs {
		if j == nil || j.schedule == nil {
			return fmt.Errorf("%w: %s[%d]: nil (build it with ferry.Periodic)", ErrInvalidConfig, field, i)
		}
		if names[j.name] {
			return fmt.Errorf("%w: %s[%d]: name %q used twice", ErrInvalidConfig, field, i, j.name)
		}
		names[j.name] = true
	}
	return nil
}

// Run enqueues the jobs' ticks until ctx is done, then returns nil. While
// the database is unavailable it logs and tries again (1 s doubling to
// 30 s); the ticks that passed meanwhile are handled as ticks missed while
// the scheduler was down (the package doc, "Periodic jobs").
func (s *Scheduler) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, j := range s.cfg.Jobs {
		wg.Go(func() { s.run(ctx, j) })
	}
	wg.Wait()
	return nil
}

// registerSQL creates a job's row the first time any replica runs it: its
// ticks start after that moment. A scheduler then starts from the row's
// last_tick, so a restart enqueues at once the latest tick missed while no
// scheduler ran.
const registerSQL = `INSERT INTO ferry_periodic (name, last_tick) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING`

// claimLockSQL locks a job's row for the tick's transaction; a replica
// racing for the same tick waits here and then sees the tick taken.
const claimLockSQL = `SELECT last_tick FROM ferry_periodic WHERE name = $1 FOR UPDATE`

const claimSQL = `UPDATE ferry_periodic SET last_tick = $2, updated_at = now() WHERE name = $1`

func (s *Scheduler) run(ctx context.Context, j *PeriodicJob) {
	log := s.log.With("periodic_job", j.name)
	backoff := time.Second
	pause := func(err error, what string) bool {
		log.Warn("ferry: periodic: "+what+"; retrying", "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
		return true
	}
	var last time.Time
	for {
		var err error
		if _, err = s.cfg.Pool.Exec(ctx, registerSQL, j.name, time.Now()); err == nil {
			err = s.cfg.Pool.QueryRow(ctx, `SELECT last_tick FROM ferry_periodic WHERE name = $1`, j.name).Scan(&last)
		}
		if err == nil {
			break
		}
		if ctx.Err() != nil || !pause(err, "cannot register the job") {
			return
		}
	}
	backoff = time.Second
	log.Info("ferry: periodic: started", "schedule", j.spec, "next", j.schedule.Next(time.Now()).UTC())
	for ctx.Err() == nil {
		now := time.Now()
		if due, _ := latestTick(j.schedule, last, now); !due.IsZero() {
			prev, err := s.fire(ctx, j, due, log)
			if err != nil {
				if ctx.Err() != nil || !pause(err, "cannot enqueue the tick") {
					return
				}
				continue
			}
			backoff = time.Second
			last = maxTime(due, prev)
			continue
		}
		next := j.schedule.Next(maxTime(last, now))
		if next.IsZero() {
			log.Info("ferry: periodic: the schedule has no further tick; stopping this job", "schedule", j.spec)
			return
		}
		t := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// fire enqueues tick due of j unless a replica did so already, in one
// transaction that locks j's row, moves its last_tick to due and inserts
// the outbox event. It returns the last_tick it found.
func (s *Scheduler) fire(ctx context.Context, j *PeriodicJob, due time.Time, log *slog.Logger) (prev time.Time, err error) {
	start := time.Now()
	// BEGIN and the lock in one round trip, as the worker's dedup does.
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(claimLockSQL, j.name)
	br := s.cfg.Pool.SendBatch(ctx, b)
	tx := br.Tx() // nil when no connection was acquired
	if _, err = br.Exec(); err == nil {
		err = br.QueryRow().Scan(&prev)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if tx == nil {
		return prev, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if errors.Is(err, pgx.ErrNoRows) {
		// The row was deleted under a running scheduler: register it
		// again just before this tick.
		if _, err = tx.Exec(ctx, registerSQL, j.name, due.Add(-time.Microsecond)); err == nil {
			err = tx.QueryRow(ctx, claimLockSQL, j.name).Scan(&prev)
		}
	}
	if err != nil {
		return prev, err
	}
	if !prev.Before(due) {
		return prev, nil // another replica enqueued this tick (or a later one)
	}
	_, missed := latestTick(j.schedule, prev, due) // the ticks in (prev, due)
	if _, err := tx.Exec(ctx, claimSQL, j.name, due); err != nil {
		return prev, err
	}
	e := j.event
	if e.AppID == "" {
		e.AppID = j.name + "@" + due.UTC().Format(time.RFC3339Nano)
	}
	ids, err := outbox.Enqueue(ctx, tx, e)
	if err != nil {
		return prev, err
	}
	if err := tx.Commit(ctx); err != nil {
		return prev, err
	}
	if missed > 0 {
		log.Warn("ferry: periodic: ticks missed while no scheduler ran were skipped; enqueued the latest only",
			"tick", due.UTC(), "skipped", missed, "last_enqueued_tick", prev.UTC(), "message_id", ids[0])
	} else {
		log.Debug("ferry: periodic: tick enqueued", "tick", due.UTC(), "message_id", ids[0], "took", time.Since(start))
	}
	return prev, nil
}

// maxTickScan bounds how many ticks latestTick walks through; a schedule
// whose ticks are so dense that more than this passed is resumed from the
// tick before now by arithmetic (intervals) or from the last tick found.
const maxTickScan = 1 << 20

// latestTick returns the latest tick of s in (after, until] (zero when
// there is none) and how many earlier ticks that interval holds.
func latestTick(s Schedule, after, until time.Time) (latest time.Time, earlier int) {
	if e, ok := s.(every); ok {
		d := time.Duration(e)
		last := until.Truncate(d)
		if !last.After(after) {
			return time.Time{}, 0
		}
		first := after.Truncate(d).Add(d)
		return last, int(last.Sub(first) / d)
	}
	n := 0
	for t := s.Next(after); !t.IsZero() && !t.After(until) && n < maxTickScan; t = s.Next(t) {
		latest = t
		n++
	}
	if n == 0 {
		return time.Time{}, 0
	}
	return latest, n - 1
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
