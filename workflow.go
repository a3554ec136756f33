package ferry

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/ferrymq/ferry/outbox"
)

// ErrWorkflowCycle is returned by EnqueueWorkflow when the dependencies
// form a cycle; the message names the jobs of one. It is
// outbox.ErrWorkflowCycle.
var ErrWorkflowCycle = outbox.ErrWorkflowCycle

// ErrInvalidWorkflow is returned by EnqueueWorkflow for a workflow it
// refuses for another reason (no jobs, a dependency on a job of another
// workflow, a Unique job, an invalid event, which also wraps
// outbox.ErrInvalidEvent); the message names the job. It is
// outbox.ErrInvalidWorkflow.
var ErrInvalidWorkflow = outbox.ErrInvalidWorkflow

// Workflow is a set of jobs with dependencies, built with AddJob or Add
// and stored in one transaction by EnqueueWorkflow: a job is published
// only when every job it runs After has completed (docs/library.md,
// "Workflows"). Build it in one goroutine; it is not safe for concurrent
// use.
type Workflow struct {
	w   outbox.Workflow
	err error
}

// NewWorkflow returns an empty workflow named name (shown by `ferry jobs
// workflow` and the console), e.g. "order.fulfil".
func NewWorkflow(name string) *Workflow { return &Workflow{w: outbox.Workflow{Name: name}} }

// WorkflowJob is a job of a Workflow, as returned by AddJob and Add; pass
// it to After to make another job wait for it.
type WorkflowJob struct {
	wf    *Workflow
	index int
}

// Index is the job's position in its workflow: EnqueueWorkflow returns
// the jobs' ids in that order.
func (j WorkflowJob) Index() int { return j.index }

// JobOption sets an option of a workflow job: After, JobName,
// CompletedBy, ReleaseOnFailure, or any EnqueueOption (WithKey,
// WithAppID, DueIn, ...).
type JobOption interface{ applyJob(*jobSpec) }

type jobSpec struct {
	wf  *Workflow
	job *outbox.WorkflowJob
}

func (o EnqueueOption) applyJob(s *jobSpec) { o(&s.job.Event) }

type jobOption func(*jobSpec)

func (o jobOption) applyJob(s *jobSpec) { o(s) }

// After makes the job wait until every one of jobs has completed: a
// consumer's handler committed it (see CompletedBy for events with
// several consumers). A job of another workflow makes EnqueueWorkflow
// fail with ErrInvalidWorkflow.
func After(jobs ...WorkflowJob) JobOption {
	return jobOption(func(s *jobSpec) {
		for _, d := range jobs {
			if d.wf != s.wf {
				if s.wf.err == nil {
					s.wf.err = fmt.Errorf("%w: %q: job %d (%s) runs after a job that is not in this workflow",
						ErrInvalidWorkflow, s.wf.w.Name, len(s.wf.w.Jobs), s.job.Event.Type)
				}
				continue
			}
			s.job.After = append(s.job.After, d.index)
		}
	})
}

// JobName names the job in the workflow's graph (default: its event
// type).
func JobName(name string) JobOption {
	return jobOption(func(s *jobSpec) { s.job.Name = name })
}

// CompletedBy names the consumer (worker.Config.Consumer) whose handler's
// commit completes the job for its dependents, and whose dead-letter
// fails it. Without it the first consumer to handle or dead-letter the
// job decides, which is exact for an event with one consumer.
func CompletedBy(consumer string) JobOption {
	return jobOption(func(s *jobSpec) { s.job.Consumer = consumer })
}

// ReleaseOnFailure releases the job when one of its dependencies is
// dead-lettered or cancelled, as if it had completed. By default such a
// dependency cancels the job, and its dependents in turn.
func ReleaseOnFailure() JobOption {
	return jobOption(func(s *jobSpec) { s.job.ReleaseOnFailure = true })
}

// AddJob adds to w a job of type eventType whose arguments are args,
// encoded as JSON (like Enqueue), with opts applied. An args that does
// not encode makes EnqueueWorkflow fail with the error (wrapping
// outbox.ErrInvalidEvent).
func AddJob[T any](w *Workflow, eventType string, args T, opts ...JobOption) WorkflowJob {
	e, err := NewEvent(eventType, args)
	if err != nil && w.err == nil {
		w.err = fmt.Errorf("ferry: workflow %q: job %d: %w", w.w.Name, len(w.w.Jobs), err)
	}
	if err != nil {
		e = outbox.Event{Type: eventType, Body: []byte{}}
	}
	return w.Add(e, opts...)
}

// Add adds to w a job of the event e (built with NewEvent, or by hand),
// with opts applied, and returns it.
func (w *Workflow) Add(e outbox.Event, opts ...JobOption) WorkflowJob {
	job := outbox.WorkflowJob{Event: e}
	s := &jobSpec{wf: w, job: &job}
	for _, o := range opts {
		o.applyJob(s)
	}
	w.w.Jobs = append(w.w.Jobs, job)
	return WorkflowJob{wf: w, index: len(w.w.Jobs) - 1}
}

// Len returns the number of jobs added to w.
func (w *Workflow) Len() int { return len(w.w.Jobs) }

// EnqueueWorkflow stores the jobs of wf and their dependencies inside the
// caller's transaction tx (outbox.EnqueueWorkflow): the jobs without
// dependencies are published once tx commits, each other job once the
// last of its dependencies completed. It returns the workflow's id (for
// outbox.WorkflowGet, `ferry jobs workflow`) and the jobs' ids, their
// message IDs, in the order they were added (WorkflowJob.Index). A cycle
// returns an error wrapping ErrWorkflowCycle, any other invalid workflow
// one wrapping ErrInvalidWorkflow; nothing is stored then. A database
// error leaves tx aborted.
func EnqueueWorkflow(ctx context.Context, tx pgx.Tx, wf *Workflow) (int64, []int64, error) {
	if wf == nil {
		return 0, nil, errors.New("ferry: enqueue workflow: workflow is nil")
	}
	if wf.err != nil {
		return 0, nil, wf.err
	}
	return outbox.EnqueueWorkflow(ctx, tx, wf.w)
}
