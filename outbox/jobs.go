package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferrymq/ferry/broker"
)

// ErrJobNotFound is returned by JobGet, JobGetByAppID and JobCancel when
// nothing ferry records knows the job: no outbox row, no cancelled row and
// no worker record (a row the relay's retention deleted, handled by no
// worker since, is not found either).
var ErrJobNotFound = errors.New("outbox: job not found")

// ErrTooLate is returned by JobCancel for a job that can no longer be
// cancelled: it was published (the broker has it), or a relay holds its
// row in a batch being published at that moment. The message says which.
var ErrTooLate = errors.New("outbox: too late to cancel the job")

// JobState is where a job (an outbox event and the messages the workers
// made of it) stands.
type JobState string

// The job states. A workflow job starts held. A job moves scheduled → pending → published → retrying
// → handled or dead, or from scheduled or pending to cancelled.
const (
	// JobScheduled: enqueued with a DueAt still in the future
	// (Event.DueAt); no relay claims it before then.
	JobScheduled JobState = "scheduled"
	// JobPending: due and not yet published (waiting for a relay, a
	// broker outage, or parked after failed publications: see
	// Job.PublishAttempts).
	JobPending JobState = "pending"
	// JobPublished: the broker confirmed it; no worker recorded anything
	// about it yet.
	JobPublished JobState = "published"
	// JobRetrying: published, and a consumer's worker recorded failed
	// attempts (worker_attempts) without handling or dead-lettering it.
	JobRetrying JobState = "retrying"
	// JobHandled: a consumer's handler committed it (processed_messages).
	JobHandled JobState = "handled"
	// JobDead: a consumer's worker dead-lettered it (worker_dead).
	JobDead JobState = "dead"
	// JobHeld: a workflow job waiting for its dependencies
	// (EnqueueWorkflow); no relay can see it until the last of them
	// settles.
	JobHeld JobState = "held"
	// JobCancelled: JobCancel took it out of the outbox before it was
	// published; it is never published.
	JobCancelled JobState = "cancelled"
)

// Job is what ferry records about one event, as JobGet reads it.
type Job struct {
	// ID is the outbox row id, the message ID as a decimal number.
	ID int64
	// State is the job's overall state. With several consumers it is the
	// most pressing of theirs: dead, then retrying, then handled (see
	// Consumers for each).
	State JobState
	// Destination, Type, Key and AppID are the event's (Event.Destination,
	// Event.Type, Event.Key, Event.AppID); empty when InOutbox is false.
	Destination, Type, Key, AppID string
	// InOutbox is false when the outbox row is gone (the relay's
	// retention deleted it after publication) and only the workers'
	// records are left: the fields of the event are then empty.
	InOutbox bool
	// EnqueuedAt is when the event was enqueued (occurred_at).
	EnqueuedAt time.Time
	// DueAt is when the event is or was due (Event.DueAt) or, for a
	// parked row, when the relay tries it again; zero when it was due at
	// once.
	DueAt time.Time
	// PublishAttempts is the number of failed publications (a failure of
	// the event's own, see Stats.Parked), PublishError the reason of the
	// last one (kept until it is published).
	PublishAttempts int
	PublishError    string
	// PublishedAt is when the broker confirmed it; zero when not
	// published.
	PublishedAt time.Time
	// CancelledAt is when JobCancel cancelled it; zero otherwise.
	CancelledAt time.Time
	// CancelReason is why it was cancelled when not by JobCancel (a
	// workflow dependency failed or was cancelled); empty otherwise.
	CancelReason string
	// Held is true while it is a workflow job waiting for its
	// dependencies (State JobHeld).
	Held bool
	// WorkflowID is the workflow it belongs to (EnqueueWorkflow,
	// WorkflowGet); 0 when none.
	WorkflowID int64
	// Consumers is what each consumer's worker recorded, in consumer
	// name order; empty before any did.
	Consumers []ConsumerJob
	// History lists the recorded events of the job in order: enqueued,
	// due, publication failures, published or cancelled, then the
	// consumers' records by time.
	History []JobEvent
}

// ConsumerJob is what one consumer's worker recorded about a job.
type ConsumerJob struct {
	// Consumer is the worker's consumer name (worker.Config.Consumer).
	Consumer string
	// State is JobRetrying, JobHandled or JobDead (the latest of
	// handled and dead when both are recorded, e.g. a DLQ replay handled).
	State JobState
	// Attempts is the number of the last failed attempt recorded (for
	// JobRetrying) or the attempt the DLQ took it at (for JobDead); 0
	// otherwise. LastError is that attempt's error.
	Attempts  int
	LastError string
	// FirstFailedAt and LastFailedAt bound the failed attempts still
	// recorded (JobRetrying); a handled or dead message's attempt
	// record is deleted by the worker.
	FirstFailedAt, LastFailedAt time.Time
	// HandledAt is when the handler's transaction committed; DeadAt when
	// the DLQ took it. Zero when not.
	HandledAt, DeadAt time.Time
}

// JobEvent is one line of Job.History.
type JobEvent struct {
	// At is when it happened; zero when ferry does not record the time
	// (publication failures keep only their count and last error).
	At time.Time
	// What is one of "enqueued", "due", "publish failed", "published",
	// "cancelled", "attempt failed", "handled", "dead".
	What string
	// Consumer is the consumer for the workers' records; empty otherwise.
	Consumer string
	// Detail says more (the error, the attempt number).
	Detail string
}

// JobFilter selects the jobs JobList returns.
type JobFilter struct {
	// State keeps the jobs in this state; empty keeps all.
	State JobState
	// Type keeps the jobs of this event type; empty keeps all.
	Type string
	// Destination keeps the jobs of this destination; empty keeps all.
	Destination string
	// Limit is the maximum number of jobs returned; 0 means 50; at most
	// 1000.
	Limit int
}

// MaxJobList is the largest JobFilter.Limit.
const MaxJobList = 1000

const jobRowsSQL = `SELECT id, destination, event_type, partition_key, COALESCE(headers->>$2, ''), occurred_at,
       processed_at, attempts, COALESCE(last_error, ''), next_attempt_at, NULL::timestamptz, false,
       (SELECT w.workflow_id FROM outbox_workflow_jobs w WHERE w.id = o.id)
FROM outbox o WHERE id = ANY($1::bigint[])
UNION ALL
SELECT id, destination, event_type, partition_key, COALESCE(headers->>$2, ''), occurred_at,
       NULL, attempts, COALESCE(last_error, ''), next_attempt_at, cancelled_at, false,
       (SELECT w.workflow_id FROM outbox_workflow_jobs w WHERE w.id = o.id)
FROM outbox_cancelled o WHERE id = ANY($1::bigint[])
UNION ALL
SELECT id, destination, event_type, partition_key, COALESCE(headers->>$2, ''), occurred_at,
       NULL, 0, '', next_attempt_at, NULL, true,
       (SELECT w.workflow_id FROM outbox_workflow_jobs w WHERE w.id = o.id)
FROM outbox_held o WHERE id = ANY($1::bigint[])`

// The per-consumer tables are keyed (consumer, message_id): a skip scan
// over the consumers (a few index probes each) finds a message's rows
// without reading the tables.
const consumersCTE = `WITH RECURSIVE c AS (
  (SELECT consumer FROM %[1]s ORDER BY consumer LIMIT 1)
  UNION ALL
  SELECT (SELECT t.consumer FROM %[1]s t WHERE t.consumer > c.consumer ORDER BY t.consumer LIMIT 1) FROM c WHERE c.consumer IS NOT NULL
)
`

var (
	jobHandledSQL = fmt.Sprintf(consumersCTE+`SELECT p.consumer, p.message_id, p.processed_at
FROM c JOIN processed_messages p ON p.consumer = c.consumer AND p.message_id = ANY($1::text[])`, "processed_messages")
	jobAttemptsSQL = fmt.Sprintf(consumersCTE+`SELECT a.consumer, a.message_id, a.attempts, a.last_error, a.dead, a.first_failed_at, a.updated_at
FROM c JOIN worker_attempts a ON a.consumer = c.consumer AND a.message_id = ANY($1::text[])`, "worker_attempts")
)

const jobDeadSQL = `SELECT consumer, message_id, attempts, last_error, dead_at FROM worker_dead WHERE message_id = ANY($1::text[])`

// JobGet returns what ferry records about the job id (the outbox row id,
// the message ID as a decimal number): the outbox row or the cancelled
// one, and the workers' records of every consumer (processed_messages,
// worker_attempts, worker_dead). It returns an error wrapping
// ErrJobNotFound when there is none. It reads only; it takes no lock.
func JobGet(ctx context.Context, pool *pgxpool.Pool, id int64) (Job, error) {
	if pool == nil {
		return Job{}, errors.New("outbox: job get: pool is nil")
	}
	jobs, err := loadJobs(ctx, pool, []int64{id})
	if err != nil {
		return Job{}, err
	}
	if len(jobs) == 0 {
		return Job{}, fmt.Errorf("%w: id %d (no outbox row, no cancelled row, no worker record)", ErrJobNotFound, id)
	}
	return jobs[0], nil
}

// maxByAppID is the number of jobs JobGetByAppID returns at most.
const maxByAppID = 100

// JobGetByAppID returns the jobs whose event carries appID
// (Event.AppID, the header broker.HeaderAppID), newest first, at most 100.
// It returns an error wrapping ErrJobNotFound when there is none. The
// lookup probes outbox_app_id_idx (the cancelled rows, few, are read
// whole).
func JobGetByAppID(ctx context.Context, pool *pgxpool.Pool, appID string) ([]Job, error) {
	if pool == nil {
		return nil, errors.New("outbox: job get: pool is nil")
	}
	if appID == "" {
		return nil, errors.New("outbox: job get: app id is empty")
	}
	// The literal 'x-app-id' (broker.HeaderAppID) lets the planner use
	// outbox_app_id_idx, an index on that expression (migration 10).
	ids, err := queryIDs(ctx, pool, `SELECT id FROM outbox WHERE headers->>'x-app-id' = $1 AND headers ? 'x-app-id'
UNION ALL SELECT id FROM outbox_cancelled WHERE headers->>'x-app-id' = $1
ORDER BY id DESC LIMIT $2`, appID, maxByAppID)
	if err != nil {
		return nil, err
	}
	jobs, err := loadJobs(ctx, pool, ids)
	if err != nil {
		return nil, err
	}
	if len(jobs) == 0 {
		return nil, fmt.Errorf("%w: app id %q (no outbox or cancelled row carries it; a row deleted by retention is not searched)", ErrJobNotFound, appID)
	}
	return jobs, nil
}

// JobList returns the jobs f selects, newest (highest id) first, at most
// f.Limit. The candidates are the outbox and cancelled rows (a row
// deleted by retention is not listed); for the states a worker decides
// (published, retrying, handled, dead) up to 20 pages of candidates are
// read, so a rare state among many jobs may return fewer than f.Limit. An
// unknown f.State or a Limit out of range is an error naming the field.
func JobList(ctx context.Context, pool *pgxpool.Pool, f JobFilter) ([]Job, error) {
	if pool == nil {
		return nil, errors.New("outbox: job list: pool is nil")
	}
	switch f.State {
	case "", JobHeld, JobScheduled, JobPending, JobPublished, JobRetrying, JobHandled, JobDead, JobCancelled:
	default:
		return nil, fmt.Errorf("outbox: job list: JobFilter.State %q: want one of held, scheduled, pending, published, retrying, handled, dead, cancelled", f.State)
	}
	if f.Limit < 0 || f.Limit > MaxJobList {
		return nil, fmt.Errorf("outbox: job list: JobFilter.Limit %d: want 0 (50) to %d", f.Limit, MaxJobList)
	}
	limit := f.Limit
	if limit == 0 {
		limit = 50
	}
	var from string
	switch f.State {
	case JobScheduled:
		from = `SELECT id FROM outbox WHERE processed_at IS NULL AND attempts = 0 AND next_attempt_at > now() AND %s`
	case JobPending:
		from = `SELECT id FROM outbox WHERE processed_at IS NULL AND NOT (attempts = 0 AND COALESCE(next_attempt_at > now(), false)) AND %s`
	case JobPublished, JobRetrying, JobHandled, JobDead:
		from = `SELECT id FROM outbox WHERE processed_at IS NOT NULL AND %s`
	case JobCancelled:
		from = `SELECT id FROM outbox_cancelled WHERE %s`
	case JobHeld:
		from = `SELECT id FROM outbox_held WHERE %s`
	default:
		from = `SELECT id FROM outbox WHERE %[1]s UNION ALL SELECT id FROM outbox_cancelled WHERE %[1]s UNION ALL SELECT id FROM outbox_held WHERE %[1]s`
	}
	cond := `($1 = '' OR event_type = $1) AND ($2 = '' OR destination = $2) AND id < $3`
	sql := `SELECT id FROM (` + fmt.Sprintf(from, cond) + `) s ORDER BY id DESC LIMIT $4`
	page := limit
	workerDecided := f.State == JobPublished || f.State == JobRetrying || f.State == JobHandled || f.State == JobDead
	if workerDecided {
		page = max(limit, 200)
	}
	var out []Job
	before := int64(1<<63 - 1)
	for pages := 0; pages < 20; pages++ {
		ids, err := queryIDs(ctx, pool, sql, f.Type, f.Destination, before, page)
		if err != nil {
			return nil, err
		}
		jobs, err := loadJobs(ctx, pool, ids)
		if err != nil {
			return nil, err
		}
		for _, j := range jobs {
			if f.State == "" || j.State == f.State {
				out = append(out, j)
				if len(out) == limit {
					return out, nil
				}
			}
		}
		if !workerDecided || len(ids) < page {
			break
		}
		before = ids[len(ids)-1]
	}
	return out, nil
}

func queryIDs(ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) ([]int64, error) {
	rows, err := pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, jobErr(ctx, "list", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, jobErr(ctx, "list", err)
	}
	return ids, nil
}

func jobErr(ctx context.Context, op string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	return fmt.Errorf("outbox: job %s: %w", op, err)
}

// loadJobs reads the jobs ids, in the order of ids, leaving out those
// nothing records.
func loadJobs(ctx context.Context, pool *pgxpool.Pool, ids []int64) ([]Job, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	byID := make(map[int64]*Job, len(ids))
	get := func(id int64) *Job {
		j := byID[id]
		if j == nil {
			j = &Job{ID: id}
			byID[id] = j
		}
		return j
	}
	rows, err := pool.Query(ctx, jobRowsSQL, ids, broker.HeaderAppID)
	if err != nil {
		return nil, jobErr(ctx, "get", err)
	}
	for rows.Next() {
		var (
			id                     int64
			j                      Job
			processed, next, cancl *time.Time
			wf                     *int64
		)
		if err := rows.Scan(&id, &j.Destination, &j.Type, &j.Key, &j.AppID, &j.EnqueuedAt, &processed, &j.PublishAttempts, &j.PublishError, &next, &cancl, &j.Held, &wf); err != nil {
			rows.Close()
			return nil, jobErr(ctx, "get", err)
		}
		j.ID, j.InOutbox = id, true
		j.PublishedAt, j.DueAt, j.CancelledAt = deref(processed), deref(next), deref(cancl)
		if wf != nil {
			j.WorkflowID = *wf
		}
		if cancl != nil && j.PublishAttempts == 0 && strings.HasPrefix(j.PublishError, "workflow: ") {
			j.CancelReason, j.PublishError = j.PublishError, ""
		}
		*get(id) = j
	}
	if err := rows.Err(); err != nil {
		return nil, jobErr(ctx, "get", err)
	}

	msgIDs := make([]string, len(ids))
	for i, id := range ids {
		msgIDs[i] = strconv.FormatInt(id, 10)
	}
	consumers := map[int64]map[string]*ConsumerJob{}
	cons := func(msgID, consumer string) *ConsumerJob {
		id, _ := strconv.ParseInt(msgID, 10, 64)
		m := consumers[id]
		if m == nil {
			m = map[string]*ConsumerJob{}
			consumers[id] = m
		}
		c := m[consumer]
		if c == nil {
			c = &ConsumerJob{Consumer: consumer}
			m[consumer] = c
		}
		return c
	}
	if err := scanEach(ctx, pool, jobHandledSQL, msgIDs, func(r pgx.Rows) error {
		var consumer, msgID string
		var at time.Time
		if err := r.Scan(&consumer, &msgID, &at); err != nil {
			return err
		}
		cons(msgID, consumer).HandledAt = at
		return nil
	}); err != nil {
		return nil, err
	}
	if err := scanEach(ctx, pool, jobAttemptsSQL, msgIDs, func(r pgx.Rows) error {
		var consumer, msgID, lastErr string
		var n int
		var dead bool
		var first, last time.Time
		if err := r.Scan(&consumer, &msgID, &n, &lastErr, &dead, &first, &last); err != nil {
			return err
		}
		c := cons(msgID, consumer)
		c.Attempts, c.LastError, c.FirstFailedAt, c.LastFailedAt = n, lastErr, first, last
		return nil
	}); err != nil {
		return nil, err
	}
	if err := scanEach(ctx, pool, jobDeadSQL, msgIDs, func(r pgx.Rows) error {
		var consumer, msgID, lastErr string
		var n int
		var at time.Time
		if err := r.Scan(&consumer, &msgID, &n, &lastErr, &at); err != nil {
			return err
		}
		c := cons(msgID, consumer)
		c.DeadAt = at
		if c.LastFailedAt.IsZero() { // a live attempt record (a replay failing) says more
			c.Attempts, c.LastError = n, lastErr
		}
		return nil
	}); err != nil {
		return nil, err
	}
	for id := range consumers {
		get(id)
	}

	out := make([]Job, 0, len(byID))
	for _, id := range ids {
		j := byID[id]
		if j == nil {
			continue
		}
		delete(byID, id) // ids may repeat
		for _, c := range consumers[id] {
			switch {
			case !c.DeadAt.IsZero() && c.DeadAt.After(c.HandledAt) && !c.LastFailedAt.After(c.DeadAt):
				c.State = JobDead
			case !c.HandledAt.IsZero() && !c.LastFailedAt.After(c.HandledAt):
				c.State = JobHandled
			default:
				c.State = JobRetrying
			}
			if c.State == JobHandled {
				c.Attempts, c.LastError = 0, ""
			}
			j.Consumers = append(j.Consumers, *c)
		}
		sort.Slice(j.Consumers, func(a, b int) bool { return j.Consumers[a].Consumer < j.Consumers[b].Consumer })
		j.State = jobState(j)
		j.History = history(j)
		out = append(out, *j)
	}
	return out, nil
}

func scanEach(ctx context.Context, pool *pgxpool.Pool, sql string, msgIDs []string, fn func(pgx.Rows) error) error {
	rows, err := pool.Query(ctx, sql, msgIDs)
	if err != nil {
		return jobErr(ctx, "get", err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return jobErr(ctx, "get", err)
		}
	}
	if err := rows.Err(); err != nil {
		return jobErr(ctx, "get", err)
	}
	return nil
}

func deref(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

func jobState(j *Job) JobState {
	switch {
	case !j.CancelledAt.IsZero():
		return JobCancelled
	case j.Held:
		return JobHeld
	case j.InOutbox && j.PublishedAt.IsZero():
		if j.PublishAttempts == 0 && j.DueAt.After(time.Now()) {
			return JobScheduled
		}
		return JobPending
	}
	state := JobPublished
	for _, c := range j.Consumers {
		switch {
		case c.State == JobDead:
			return JobDead
		case c.State == JobRetrying:
			state = JobRetrying
		case c.State == JobHandled && state == JobPublished:
			state = JobHandled
		}
	}
	return state
}

func history(j *Job) []JobEvent {
	var h []JobEvent
	if j.InOutbox {
		h = append(h, JobEvent{At: j.EnqueuedAt, What: "enqueued", Detail: "destination " + j.Destination})
		if j.Held {
			h = append(h, JobEvent{What: "held", Detail: fmt.Sprintf("waiting for its dependencies in workflow %d", j.WorkflowID)})
		}
		if !j.DueAt.IsZero() && j.PublishAttempts == 0 {
			h = append(h, JobEvent{At: j.DueAt, What: "due"})
		}
		if j.PublishAttempts > 0 {
			d := fmt.Sprintf("%d failed publication(s)", j.PublishAttempts)
			if j.PublishError != "" {
				d += "; last: " + j.PublishError
			}
			if !j.DueAt.IsZero() && j.PublishedAt.IsZero() && j.CancelledAt.IsZero() {
				d += "; next try at " + j.DueAt.UTC().Format(time.RFC3339)
			}
			h = append(h, JobEvent{What: "publish failed", Detail: d})
		}
		if !j.PublishedAt.IsZero() {
			h = append(h, JobEvent{At: j.PublishedAt, What: "published"})
		}
		if !j.CancelledAt.IsZero() {
			d := "never published"
			if j.CancelReason != "" {
				d += "; " + j.CancelReason
			}
			h = append(h, JobEvent{At: j.CancelledAt, What: "cancelled", Detail: d})
		}
	}
	var w []JobEvent
	for _, c := range j.Consumers {
		if !c.LastFailedAt.IsZero() {
			w = append(w, JobEvent{At: c.LastFailedAt, What: "attempt failed", Consumer: c.Consumer,
				Detail: fmt.Sprintf("attempt %d: %s (first failure at %s)", c.Attempts, c.LastError, c.FirstFailedAt.UTC().Format(time.RFC3339))})
		}
		if !c.HandledAt.IsZero() {
			w = append(w, JobEvent{At: c.HandledAt, What: "handled", Consumer: c.Consumer})
		}
		if !c.DeadAt.IsZero() {
			d := "dead-lettered"
			if c.State == JobDead {
				d = fmt.Sprintf("dead-lettered after attempt %d: %s", c.Attempts, c.LastError)
			}
			w = append(w, JobEvent{At: c.DeadAt, What: "dead", Consumer: c.Consumer, Detail: d})
		}
	}
	slices.SortStableFunc(w, func(a, b JobEvent) int { return a.At.Compare(b.At) })
	return append(h, w...)
}

// cancelSQL moves the row id, if no relay holds it (SKIP LOCKED: the
// claim's own row lock) and it is not published, from the outbox to
// outbox_cancelled in one statement, and frees its unique key
// (Event.UniqueKey) so that a new Enqueue of the key is not answered
// with the cancelled event. A relay claiming afterwards cannot see the
// row; one that claimed it first holds its lock, and the row is skipped.
const cancelSQL = `WITH c AS (
  SELECT id FROM outbox WHERE id = $1 AND processed_at IS NULL FOR UPDATE SKIP LOCKED
), d AS (
  DELETE FROM outbox o USING c WHERE o.id = c.id
  RETURNING o.id, o.event_type, o.partition_key, o.payload, o.headers, o.occurred_at, o.attempts, o.last_error, o.next_attempt_at, o.destination
), u AS (
  DELETE FROM outbox_unique q USING d WHERE q.event_id = d.id
), h AS (
  DELETE FROM outbox_held WHERE id = $1
  RETURNING id, event_type, partition_key, payload, headers, occurred_at, 0 AS attempts, NULL::text AS last_error, next_attempt_at, destination
)
INSERT INTO outbox_cancelled (id, event_type, partition_key, payload, headers, occurred_at, attempts, last_error, next_attempt_at, destination)
SELECT id, event_type, partition_key, payload, headers, occurred_at, attempts, last_error, next_attempt_at, destination FROM d
UNION ALL
SELECT id, event_type, partition_key, payload, headers, occurred_at, attempts, last_error, next_attempt_at, destination FROM h
RETURNING id`

// JobCancel cancels the job id if it is not yet published (held,
// scheduled or pending, parked included): its row moves from the outbox to
// outbox_cancelled, atomically, so no relay ever publishes it, and its
// unique key, if any, is freed. It returns the job as it now is
// (JobCancelled). Cancelling a cancelled job changes nothing and returns
// it. It returns an error wrapping ErrTooLate when the job was published
// (the message says when; the broker has it and a worker may have
// handled it) or a relay holds its row at that moment, publishing it (get
// it again: if the publication failed it is pending and can be
// cancelled), and one wrapping ErrJobNotFound when nothing records it.
// Cancelling a workflow job cancels its dependents, and theirs, in the
// same transaction (those enqueued with WorkflowJob.ReleaseOnFailure are
// released instead, once their other dependencies completed).
func JobCancel(ctx context.Context, pool *pgxpool.Pool, id int64) (Job, error) {
	if pool == nil {
		return Job{}, errors.New("outbox: job cancel: pool is nil")
	}
	var got int64
	err := pool.QueryRow(ctx, cancelSQL, id).Scan(&got)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return Job{}, jobErr(ctx, "cancel", err)
	}
	j, gerr := JobGet(ctx, pool, id)
	if gerr != nil {
		return Job{}, gerr
	}
	if err == nil || j.State == JobCancelled {
		return j, nil
	}
	if !j.PublishedAt.IsZero() || !j.InOutbox {
		at := "before its row was deleted by retention"
		if !j.PublishedAt.IsZero() {
			at = "at " + j.PublishedAt.UTC().Format(time.RFC3339Nano)
		}
		return j, fmt.Errorf("%w: job %d was published %s, the broker has it (state %s)", ErrTooLate, id, at, j.State)
	}
	return j, fmt.Errorf("%w: job %d is being published: a relay holds its row in a batch; get it again, and cancel it if it is still pending (its publication failed)", ErrTooLate, id)
}
