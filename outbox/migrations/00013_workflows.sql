-- Version 13. Workflows: jobs with dependencies (outbox/workflow.go,
-- EnqueueWorkflow, WorkflowGet; outbox/doc.go "Workflows"). Version 12 is
-- left to another change; goose applies the versions it finds in order
-- and does not need them consecutive.
--
-- A job that waits for other jobs is not in the outbox: EnqueueWorkflow
-- stores it in outbox_held (the columns of an outbox row), so neither the
-- polling relay's claim nor the WAL relay's stream can see it, and their
-- statements, indexes and cost are what they were. The jobs without
-- dependencies go to the outbox as any event. Each job has a row in
-- outbox_workflow_jobs counting the dependencies not yet settled
-- (waiting), and each edge a row in outbox_workflow_edges.
--
-- A dependency settles in the transaction that records it, through the
-- triggers below, so a job is released (moved from outbox_held into the
-- outbox, where a relay publishes it) exactly when the last of its
-- dependencies commits its record, and a kill -9 anywhere leaves either
-- both or neither:
--   * completed: a worker's dedup row (processed_messages) committed. A
--     deferred constraint trigger runs at the commit of the handler's
--     transaction and checks that the row is still there (the batch
--     worker deletes the dedup row of a message whose handler failed);
--   * failed: a worker dead-lettered it (worker_dead inserted);
--   * cancelled: JobCancel, or a cancelled dependency, moved it to
--     outbox_cancelled.
-- A failed or cancelled dependency cancels its dependents, or, for a job
-- enqueued with on_dep_failure = 'release', counts as settled.
-- outbox_workflow_jobs.consumer names the consumer whose record settles
-- the job; '' lets the first consumer's record settle it.
--
-- No foreign keys: EnqueueWorkflow writes the three tables together, and
-- a foreign key costs a trigger call per row written. Retention
-- (outbox.Prune) deletes a workflow's rows of all three, once no job of it
-- is held.

-- +goose Up
CREATE TABLE IF NOT EXISTS outbox_workflows (
    id         BIGSERIAL   PRIMARY KEY,
    name       TEXT        NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS outbox_workflows_created_at_idx ON outbox_workflows (created_at);

CREATE TABLE IF NOT EXISTS outbox_workflow_jobs (
    -- The job's outbox row id (its message ID).
    id             BIGINT      PRIMARY KEY,
    workflow_id    BIGINT      NOT NULL,
    name           TEXT        NOT NULL,
    consumer       TEXT        NOT NULL DEFAULT '',
    on_dep_failure TEXT        NOT NULL DEFAULT 'cancel' CHECK (on_dep_failure IN ('cancel', 'release')),
    -- Dependencies not yet settled; the job is released at 0.
    waiting        INT         NOT NULL,
    -- NULL until settled, then 'completed', 'failed' or 'cancelled'.
    outcome        TEXT,
    settled_by     TEXT,
    settled_at     TIMESTAMPTZ,
    released_at    TIMESTAMPTZ
);

CREATE INDEX IF NOT EXISTS outbox_workflow_jobs_workflow_idx ON outbox_workflow_jobs (workflow_id, id);

CREATE TABLE IF NOT EXISTS outbox_workflow_edges (
    -- dep must settle before job is released.
    dep BIGINT NOT NULL,
    job BIGINT NOT NULL,
    PRIMARY KEY (dep, job)
);

CREATE INDEX IF NOT EXISTS outbox_workflow_edges_job_idx ON outbox_workflow_edges (job);

CREATE TABLE IF NOT EXISTS outbox_held (
    id              BIGINT      PRIMARY KEY,
    event_type      TEXT        NOT NULL,
    partition_key   TEXT        NOT NULL DEFAULT '',
    payload         BYTEA       NOT NULL,
    headers         JSONB       NOT NULL DEFAULT '{}',
    occurred_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    next_attempt_at TIMESTAMPTZ,
    destination     TEXT        NOT NULL
);

-- +goose StatementBegin
-- ferry_workflow_settle settles the workflow job job_id with outcome
-- ('completed', 'failed', 'cancelled') when by_consumer may settle it
-- (NULL: anyone, for a cancel) and it is not settled yet, then releases
-- or cancels its dependents.
CREATE OR REPLACE FUNCTION ferry_workflow_settle(job_id BIGINT, by_consumer TEXT, how TEXT) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    d        BIGINT;
    left_    INT;
    policy   TEXT;
    released BIGINT[] := '{}';
    doomed   BIGINT[] := '{}';
    moved    BIGINT[];
BEGIN
    UPDATE outbox_workflow_jobs SET outcome = how, settled_by = by_consumer, settled_at = now()
    WHERE id = job_id AND outcome IS NULL AND (by_consumer IS NULL OR consumer = '' OR consumer = by_consumer);
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- One primary-key update per dependent, in id order: every statement
    -- is an index probe whatever the tables' statistics, and two
    -- dependencies settling at once lock their common dependents in the
    -- same order.
    FOR d IN SELECT e.job FROM outbox_workflow_edges e WHERE e.dep = job_id ORDER BY e.job LOOP
        UPDATE outbox_workflow_jobs
        SET waiting = waiting - CASE WHEN how = 'completed' OR on_dep_failure = 'release' THEN 1 ELSE 0 END
        WHERE id = d
        RETURNING waiting, on_dep_failure INTO left_, policy;
        IF how <> 'completed' AND policy = 'cancel' THEN
            doomed := doomed || d;
        ELSIF left_ = 0 THEN
            released := released || d;
        END IF;
    END LOOP;
    IF cardinality(released) > 0 THEN
        WITH h AS (
            DELETE FROM outbox_held WHERE id = ANY (released)
            RETURNING id, event_type, partition_key, payload, headers, next_attempt_at, destination
        ), i AS (
            INSERT INTO outbox (id, event_type, partition_key, payload, headers, next_attempt_at, occurred_at, destination)
            SELECT id, event_type, partition_key, payload, headers, next_attempt_at, GREATEST(now(), next_attempt_at), destination FROM h
            RETURNING id
        )
        SELECT array_agg(id) INTO moved FROM i;
        IF moved IS NOT NULL THEN
            UPDATE outbox_workflow_jobs SET released_at = now() WHERE id = ANY (moved);
            PERFORM pg_notify('ferry_outbox', '');
        END IF;
    END IF;
    IF cardinality(doomed) > 0 THEN
        -- Each insert fires ferry_workflow_cancelled, which settles the
        -- dependent as cancelled and goes on down the graph.
        WITH h AS (
            DELETE FROM outbox_held WHERE id = ANY (doomed)
            RETURNING id, event_type, partition_key, payload, headers, occurred_at, next_attempt_at, destination
        )
        INSERT INTO outbox_cancelled (id, event_type, partition_key, payload, headers, occurred_at, attempts, last_error, next_attempt_at, destination)
        SELECT id, event_type, partition_key, payload, headers, occurred_at, 0,
               'workflow: dependency ' || job_id || ' ' || how, next_attempt_at, destination
        FROM h ORDER BY id;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ferry_workflow_handled() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.message_id ~ '^[1-9][0-9]{0,17}$'
       AND EXISTS (SELECT 1 FROM outbox_workflow_jobs WHERE id = NEW.message_id::bigint AND outcome IS NULL)
       AND EXISTS (SELECT 1 FROM processed_messages WHERE consumer = NEW.consumer AND message_id = NEW.message_id) THEN
        PERFORM ferry_workflow_settle(NEW.message_id::bigint, NEW.consumer, 'completed');
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ferry_workflow_dead() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.message_id ~ '^[1-9][0-9]{0,17}$' THEN
        PERFORM ferry_workflow_settle(NEW.message_id::bigint, NEW.consumer, 'failed');
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ferry_workflow_cancelled() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM ferry_workflow_settle(NEW.id, NULL, 'cancelled');
    RETURN NULL;
END
$$;
-- +goose StatementEnd

DROP TRIGGER IF EXISTS ferry_workflow_handled ON processed_messages;
CREATE CONSTRAINT TRIGGER ferry_workflow_handled AFTER INSERT ON processed_messages
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ferry_workflow_handled();
DROP TRIGGER IF EXISTS ferry_workflow_dead ON worker_dead;
CREATE TRIGGER ferry_workflow_dead AFTER INSERT ON worker_dead
    FOR EACH ROW EXECUTE FUNCTION ferry_workflow_dead();
DROP TRIGGER IF EXISTS ferry_workflow_cancelled ON outbox_cancelled;
CREATE TRIGGER ferry_workflow_cancelled AFTER INSERT ON outbox_cancelled
    FOR EACH ROW EXECUTE FUNCTION ferry_workflow_cancelled();

-- +goose Down
DROP TRIGGER IF EXISTS ferry_workflow_cancelled ON outbox_cancelled;
DROP TRIGGER IF EXISTS ferry_workflow_dead ON worker_dead;
DROP TRIGGER IF EXISTS ferry_workflow_handled ON processed_messages;
DROP FUNCTION IF EXISTS ferry_workflow_cancelled();
DROP FUNCTION IF EXISTS ferry_workflow_dead();
DROP FUNCTION IF EXISTS ferry_workflow_handled();
DROP FUNCTION IF EXISTS ferry_workflow_settle(BIGINT, TEXT, TEXT);
DROP TABLE IF EXISTS outbox_held;
DROP TABLE IF EXISTS outbox_workflow_edges;
DROP TABLE IF EXISTS outbox_workflow_jobs;
DROP TABLE IF EXISTS outbox_workflows;
