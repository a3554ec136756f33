package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrWorkflowCycle is returned by EnqueueWorkflow for a workflow whose
// dependencies form a cycle (a job that would wait for itself); the
// message names the jobs of one cycle. Nothing is stored.
var ErrWorkflowCycle = errors.New("outbox: workflow has a dependency cycle")

// ErrInvalidWorkflow is returned by EnqueueWorkflow for a workflow it
// refuses for another reason than a cycle: no jobs, too many, an edge to a
// job that is not in the workflow, a unique job, an invalid event (the
// error then wraps ErrInvalidEvent too). The message names the job.
// Nothing is stored.
var ErrInvalidWorkflow = errors.New("outbox: invalid workflow")

// ErrWorkflowNotFound is returned by WorkflowGet for an id no workflow
// has (never enqueued, or deleted by retention).
var ErrWorkflowNotFound = errors.New("outbox: workflow not found")

// MaxWorkflowJobs bounds the number of jobs of one workflow.
const MaxWorkflowJobs = 10000

// MaxWorkflowNameBytes bounds Workflow.Name and WorkflowJob.Name (bytes).
const MaxWorkflowNameBytes = 255

// Workflow is a set of jobs with dependencies, enqueued together by
// EnqueueWorkflow (see the package documentation, "Workflows").
type Workflow struct {
	// Name says what the workflow does, e.g. "order.fulfil"; shown by
	// WorkflowGet, `ferry jobs workflow` and the console. Required, at
	// most MaxWorkflowNameBytes bytes.
	Name string
	// Jobs are the workflow's jobs; WorkflowJob.After refers to them by
	// index. 1..MaxWorkflowJobs of them.
	Jobs []WorkflowJob
}

// WorkflowJob is one job of a Workflow.
type WorkflowJob struct {
	// Name names the job inside its workflow, e.g. "charge"; defaults to
	// the event's Type. At most MaxWorkflowNameBytes bytes.
	Name string
	// Event is the job's event. Its UniqueKey must be empty (a unique
	// event may be answered with another event, which is not part of
	// the workflow). A DueAt is honoured after the job is released.
	Event Event
	// After lists the indexes in Workflow.Jobs of the jobs that must
	// complete before this one is published. Empty: published at once.
	After []int
	// Consumer names the consumer (worker.Config.Consumer) whose record
	// settles this job for its dependents: its handler's commit completes
	// it, its dead-letter fails it. Empty: the first consumer to record
	// either settles it, which is exact for an event with one consumer.
	Consumer string
	// ReleaseOnFailure releases this job when a dependency fails (is
	// dead-lettered) or is cancelled, as if it had completed; by
	// default such a dependency cancels this job and, in turn, its own
	// dependents.
	ReleaseOnFailure bool
}

// validateWorkflow checks w: names, sizes, events, edges, cycles.
func validateWorkflow(w Workflow) error {
	if w.Name == "" || len(w.Name) > MaxWorkflowNameBytes {
		return fmt.Errorf("%w: Name %q: want 1 to %d bytes", ErrInvalidWorkflow, clipID(w.Name), MaxWorkflowNameBytes)
	}
	if len(w.Jobs) == 0 || len(w.Jobs) > MaxWorkflowJobs {
		return fmt.Errorf("%w: %q has %d jobs: want 1 to %d", ErrInvalidWorkflow, w.Name, len(w.Jobs), MaxWorkflowJobs)
	}
	for i, j := range w.Jobs {
		if len(j.Name) > MaxWorkflowNameBytes {
			return fmt.Errorf("%w: Jobs[%d].Name: %d bytes, at most %d", ErrInvalidWorkflow, i, len(j.Name), MaxWorkflowNameBytes)
		}
		if j.Event.UniqueKey != "" {
			return fmt.Errorf("%w: Jobs[%d] (%s): a workflow job cannot have a UniqueKey", ErrInvalidWorkflow, i, jobName(j))
		}
		if err := j.Event.validate(i); err != nil {
			return fmt.Errorf("%w: Jobs[%d] (%s): %w", ErrInvalidWorkflow, i, jobName(j), err)
		}
		for _, d := range j.After {
			if d < 0 || d >= len(w.Jobs) {
				return fmt.Errorf("%w: Jobs[%d] (%s) depends on job %d, which is not in the workflow (%d jobs)", ErrInvalidWorkflow, i, jobName(j), d, len(w.Jobs))
			}
		}
	}
	if c := findCycle(w.Jobs); c != nil {
		names := make([]string, len(c))
		for k, i := range c {
			names[k] = fmt.Sprintf("%d (%s)", i, jobName(w.Jobs[i]))
		}
		return fmt.Errorf("%w: %q: job %s", ErrWorkflowCycle, w.Name, strings.Join(names, " waits for "))
	}
	return nil
}

func jobName(j WorkflowJob) string { return cmp.Or(j.Name, j.Event.Type) }

// findCycle returns the indexes of one dependency cycle, its first job
// repeated at the end, or nil.
func findCycle(jobs []WorkflowJob) []int {
	const (
		white = iota
		grey
		black
	)
	color := make([]int, len(jobs))
	var stack []int
	var found []int
	var visit func(i int) bool
	visit = func(i int) bool {
		color[i] = grey
		stack = append(stack, i)
		for _, d := range jobs[i].After {
			switch color[d] {
			case grey:
				k := slices.Index(stack, d)
				found = append(slices.Clone(stack[k:]), d)
				return true
			case white:
				if visit(d) {
					return true
				}
			}
		}
		stack = stack[:len(stack)-1]
		color[i] = black
		return false
	}
	for i := range jobs {
		if color[i] == white && visit(i) {
			return found
		}
	}
	return nil
}

const workflowIDsSQL = `SELECT nextval(pg_get_serial_sequence('outbox_workflows', 'id')),
       ARRAY(SELECT nextval('outbox_id_seq') FROM generate_series(1, $1::int))`

const workflowInsertSQL = `INSERT INTO outbox_workflows (id, name) VALUES ($1, $2)`

const workflowJobsSQL = `INSERT INTO outbox_workflow_jobs (id, workflow_id, name, consumer, on_dep_failure, waiting)
SELECT i, $1, n, c, f, w FROM unnest($2::bigint[], $3::text[], $4::text[], $5::text[], $6::int[]) AS j(i, n, c, f, w)`

const workflowEdgesSQL = `INSERT INTO outbox_workflow_edges (dep, job) SELECT * FROM unnest($1::bigint[], $2::bigint[])`

// workflowRowsSQL inserts the jobs without dependencies into the outbox
// (%s = outbox) or the others into outbox_held (%s = outbox_held), under
// the ids taken by workflowIDsSQL.
const workflowRowsSQL = `INSERT INTO %s (id, event_type, partition_key, payload, headers, next_attempt_at, occurred_at, destination)
SELECT i, t, k, p, h, d, GREATEST(now(), d), dst
FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bytea[], $5::jsonb[], $6::timestamptz[], $7::text[]) AS e(i, t, k, p, h, d, dst)`

// EnqueueWorkflow stores the jobs of w with their dependencies inside the
// caller's transaction tx, and returns the workflow's id and the jobs'
// outbox row ids (their message IDs) in the order of w.Jobs. The jobs
// without dependencies are inserted into the outbox and published as any
// event once tx commits; the others wait in outbox_held, out of every
// relay's sight, and each is moved into the outbox by the transaction
// that settles the last of its dependencies (a worker's handler commit;
// see the package documentation, "Workflows"). It costs two round trips
// and six statements whatever the number of jobs (plus a NOTIFY).
//
// w is validated first: a dependency cycle returns an error wrapping
// ErrWorkflowCycle naming the jobs of one cycle, any other problem one
// wrapping ErrInvalidWorkflow naming the job (and ErrInvalidEvent for an
// invalid event); nothing is stored then. A database error is returned
// wrapped and leaves tx aborted.
func EnqueueWorkflow(ctx context.Context, tx pgx.Tx, w Workflow) (id int64, jobIDs []int64, err error) {
	if tx == nil {
		return 0, nil, errors.New("outbox: enqueue workflow: tx is nil")
	}
	if err := validateWorkflow(w); err != nil {
		return 0, nil, err
	}
	if err := ctx.Err(); err != nil {
		return 0, nil, err
	}
	events := make([]Event, len(w.Jobs))
	for i, j := range w.Jobs {
		events[i] = j.Event
	}
	a, err := prepare(events)
	if err != nil {
		return 0, nil, fmt.Errorf("%w: %w", ErrInvalidWorkflow, err)
	}
	fail := func(err error) (int64, []int64, error) {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return 0, nil, ctxErr
		}
		return 0, nil, fmt.Errorf("outbox: enqueue workflow %q: %w", w.Name, err)
	}
	if err := tx.QueryRow(ctx, workflowIDsSQL, len(w.Jobs)).Scan(&id, &jobIDs); err != nil {
		return fail(err)
	}
	slices.Sort(jobIDs)
	n := len(w.Jobs)
	names, consumers, policies := make([]string, n), make([]string, n), make([]string, n)
	waiting := make([]int32, n)
	var deps, dependents []int64
	type rows struct {
		ids                         []int64
		types, keys, headers, dests []string
		bodies                      [][]byte
		due                         []pgtype.Timestamptz
		hasNow                      bool
	}
	var roots, held rows
	for i, j := range w.Jobs {
		names[i], consumers[i], policies[i] = jobName(j), j.Consumer, "cancel"
		if j.ReleaseOnFailure {
			policies[i] = "release"
		}
		after := slices.Clone(j.After)
		slices.Sort(after)
		after = slices.Compact(after)
		waiting[i] = int32(len(after))
		for _, d := range after {
			deps, dependents = append(deps, jobIDs[d]), append(dependents, jobIDs[i])
		}
		r := &roots
		if len(after) > 0 {
			r = &held
		}
		r.ids = append(r.ids, jobIDs[i])
		r.types, r.keys, r.headers, r.dests = append(r.types, a.types[i]), append(r.keys, a.keys[i]), append(r.headers, a.headers[i]), append(r.dests, a.dests[i])
		r.bodies, r.due = append(r.bodies, a.bodies[i]), append(r.due, a.due[i])
		if !j.Event.DueAt.After(time.Now()) {
			r.hasNow = true
		}
	}
	batch := &pgx.Batch{}
	batch.Queue(workflowInsertSQL, id, w.Name)
	batch.Queue(workflowJobsSQL, id, jobIDs, names, consumers, policies, waiting)
	batch.Queue(workflowEdgesSQL, deps, dependents)
	batch.Queue(fmt.Sprintf(workflowRowsSQL, "outbox"), roots.ids, roots.types, roots.keys, roots.bodies, roots.headers, roots.due, roots.dests)
	batch.Queue(fmt.Sprintf(workflowRowsSQL, "outbox_held"), held.ids, held.types, held.keys, held.bodies, held.headers, held.due, held.dests)
	if roots.hasNow {
		batch.Queue("SELECT pg_notify($1, '')", NotifyChannel)
	}
	if err := tx.SendBatch(ctx, batch).Close(); err != nil {
		return fail(err)
	}
	return id, jobIDs, nil
}

// WorkflowInfo is what WorkflowGet reads about one workflow.
type WorkflowInfo struct {
	// ID is the workflow's id (EnqueueWorkflow's), Name its Workflow.Name.
	ID   int64
	Name string
	// CreatedAt is when it was enqueued (the transaction's start).
	CreatedAt time.Time
	// Jobs are its jobs in id order (the order of Workflow.Jobs).
	Jobs []WorkflowJobInfo
	// Done counts the jobs that completed, Failed those dead-lettered,
	// Cancelled those cancelled; the others are held or on their way.
	Done, Failed, Cancelled int
}

// WorkflowJobInfo is one job of a WorkflowInfo.
type WorkflowJobInfo struct {
	// Job is the job as JobGet reads it: Job.State is JobHeld while it
	// waits for its dependencies.
	Job
	// Name is its WorkflowJob.Name (or event type), Consumer its
	// WorkflowJob.Consumer, ReleaseOnFailure its option.
	Name, Consumer   string
	ReleaseOnFailure bool
	// After are the ids of the jobs it depends on, ascending.
	After []int64
	// Waiting is the number of its dependencies not yet settled.
	Waiting int
	// Outcome is how it settled for its dependents: "" (not yet),
	// "completed", "failed" or "cancelled"; SettledBy the consumer whose
	// record settled it ("" for a cancel), SettledAt when.
	Outcome, SettledBy string
	SettledAt          time.Time
	// ReleasedAt is when its last dependency released it into the
	// outbox; zero for a job without dependencies or not released.
	ReleasedAt time.Time
	// Layer is its depth in the graph: 0 without dependencies, else one
	// more than its deepest dependency's.
	Layer int
}

const workflowGetSQL = `SELECT name, created_at FROM outbox_workflows WHERE id = $1`

const workflowJobsGetSQL = `SELECT j.id, j.name, j.consumer, j.on_dep_failure = 'release', j.waiting,
       COALESCE(j.outcome, ''), COALESCE(j.settled_by, ''), j.settled_at, j.released_at,
       COALESCE((SELECT array_agg(e.dep ORDER BY e.dep) FROM outbox_workflow_edges e WHERE e.job = j.id), '{}')
FROM outbox_workflow_jobs j WHERE j.workflow_id = $1 ORDER BY j.id`

// WorkflowGet returns the workflow id with each job's state (JobGet's),
// its dependencies and how it settled. It returns an error wrapping
// ErrWorkflowNotFound when no workflow has the id. It reads only; its
// statements take no lock. It costs six queries whatever the number of
// jobs.
func WorkflowGet(ctx context.Context, pool *pgxpool.Pool, id int64) (WorkflowInfo, error) {
	if pool == nil {
		return WorkflowInfo{}, errors.New("outbox: workflow get: pool is nil")
	}
	wf := WorkflowInfo{ID: id}
	err := pool.QueryRow(ctx, workflowGetSQL, id).Scan(&wf.Name, &wf.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return WorkflowInfo{}, fmt.Errorf("%w: id %d (never enqueued, or deleted by retention)", ErrWorkflowNotFound, id)
	}
	if err != nil {
		return WorkflowInfo{}, jobErr(ctx, "workflow get", err)
	}
	rows, err := pool.Query(ctx, workflowJobsGetSQL, id)
	if err != nil {
		return WorkflowInfo{}, jobErr(ctx, "workflow get", err)
	}
	var ids []int64
	for rows.Next() {
		var j WorkflowJobInfo
		var settled, released *time.Time
		if err := rows.Scan(&j.ID, &j.Name, &j.Consumer, &j.ReleaseOnFailure, &j.Waiting, &j.Outcome, &j.SettledBy, &settled, &released, &j.After); err != nil {
			rows.Close()
			return WorkflowInfo{}, jobErr(ctx, "workflow get", err)
		}
		j.SettledAt, j.ReleasedAt = deref(settled), deref(released)
		wf.Jobs = append(wf.Jobs, j)
		ids = append(ids, j.ID)
	}
	if err := rows.Err(); err != nil {
		return WorkflowInfo{}, jobErr(ctx, "workflow get", err)
	}
	jobs, err := loadJobs(ctx, pool, ids)
	if err != nil {
		return WorkflowInfo{}, err
	}
	byID := make(map[int64]Job, len(jobs))
	for _, j := range jobs {
		byID[j.ID] = j
	}
	index := make(map[int64]int, len(wf.Jobs))
	for i := range wf.Jobs {
		j := &wf.Jobs[i]
		if got, ok := byID[j.ID]; ok {
			j.Job = got
		}
		index[j.ID] = i
		switch j.Outcome {
		case "completed":
			wf.Done++
		case "failed":
			wf.Failed++
		case "cancelled":
			wf.Cancelled++
		}
	}
	// Ids ascend in Workflow.Jobs order, but a dependency may come later
	// in it: iterate to a fixed point (at most len(Jobs) rounds).
	for changed, round := true, 0; changed && round <= len(wf.Jobs); round++ {
		changed = false
		for i := range wf.Jobs {
			j := &wf.Jobs[i]
			for _, d := range j.After {
				if k, ok := index[d]; ok && wf.Jobs[k].Layer+1 > j.Layer {
					j.Layer, changed = wf.Jobs[k].Layer+1, true
				}
			}
		}
	}
	return wf, nil
}

// WorkflowSummary is one line of WorkflowList.
type WorkflowSummary struct {
	ID        int64
	Name      string
	CreatedAt time.Time
	// Jobs counts its jobs; Done, Failed, Cancelled those settled so;
	// Held those still waiting for a dependency.
	Jobs, Done, Failed, Cancelled, Held int
}

const workflowListSQL = `SELECT w.id, w.name, w.created_at, count(j.id),
       count(*) FILTER (WHERE j.outcome = 'completed'), count(*) FILTER (WHERE j.outcome = 'failed'),
       count(*) FILTER (WHERE j.outcome = 'cancelled'),
       count(*) FILTER (WHERE j.waiting > 0 AND j.outcome IS NULL AND j.released_at IS NULL)
FROM (SELECT * FROM outbox_workflows ORDER BY id DESC LIMIT $1) w
LEFT JOIN outbox_workflow_jobs j ON j.workflow_id = w.id
GROUP BY w.id, w.name, w.created_at ORDER BY w.id DESC`

// WorkflowList returns the newest workflows, newest first, at most limit
// (1..MaxJobList; 0 means 50), with their jobs counted by outcome.
func WorkflowList(ctx context.Context, pool *pgxpool.Pool, limit int) ([]WorkflowSummary, error) {
	if pool == nil {
		return nil, errors.New("outbox: workflow list: pool is nil")
	}
	if limit < 0 || limit > MaxJobList {
		return nil, fmt.Errorf("outbox: workflow list: limit %d: want 0 (50) to %d", limit, MaxJobList)
	}
	if limit == 0 {
		limit = 50
	}
	rows, err := pool.Query(ctx, workflowListSQL, limit)
	if err != nil {
		return nil, jobErr(ctx, "workflow list", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (WorkflowSummary, error) {
		var s WorkflowSummary
		err := r.Scan(&s.ID, &s.Name, &s.CreatedAt, &s.Jobs, &s.Done, &s.Failed, &s.Cancelled, &s.Held)
		return s, err
	})
	if err != nil {
		return nil, jobErr(ctx, "workflow list", err)
	}
	return out, nil
}
