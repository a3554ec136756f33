-- Version 8. Finding and cancelling a job (outbox/jobs.go, JobGet,
-- JobList, JobCancel; outbox/doc.go "Jobs").
--
-- outbox_cancelled holds the rows JobCancel took out of the outbox: the
-- cancel moves the row here (DELETE ... RETURNING, then INSERT, in one
-- statement), so the relay's claim, its indexes and its cost are what
-- they were: a cancelled event is not in the outbox table and can never
-- be claimed or published.
--
-- worker_dead records the messages a worker dead-lettered (the DLQ took
-- its copy): worker_attempts keeps a message's failed attempts only until
-- it is handled or dead-lettered, so without this nothing in PostgreSQL
-- says "dead". Written by package worker next to worker_attempts.

-- +goose Up
CREATE TABLE IF NOT EXISTS outbox_cancelled (
    id           BIGINT      PRIMARY KEY,
    event_type   TEXT        NOT NULL,
    partition_key TEXT       NOT NULL DEFAULT '',
    payload      BYTEA       NOT NULL,
    headers      JSONB       NOT NULL DEFAULT '{}',
    occurred_at  TIMESTAMPTZ NOT NULL,
    attempts     INT         NOT NULL DEFAULT 0,
    last_error   TEXT,
    next_attempt_at TIMESTAMPTZ,
    destination  TEXT        NOT NULL,
    cancelled_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS worker_dead (
    consumer    TEXT        NOT NULL,
    message_id  TEXT        NOT NULL,
    -- The last attempt (1-based) and the reason the DLQ copy carries.
    attempts    INT         NOT NULL,
    last_error  TEXT        NOT NULL DEFAULT '',
    dead_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

CREATE INDEX IF NOT EXISTS worker_dead_message_id_idx ON worker_dead (message_id);

-- Retention (outbox.Prune) deletes both after the relay's Retention.
CREATE INDEX IF NOT EXISTS outbox_cancelled_cancelled_at_idx ON outbox_cancelled (cancelled_at);
CREATE INDEX IF NOT EXISTS worker_dead_dead_at_idx ON worker_dead (dead_at);

-- +goose Down
DROP TABLE IF EXISTS worker_dead;
DROP TABLE IF EXISTS outbox_cancelled;
