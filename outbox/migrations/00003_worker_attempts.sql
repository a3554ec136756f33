-- Version 3 (version 2 is the relay's per-key order index).
-- The workers' attempt record: how many attempts of a message failed for a
-- consumer, kept in the database so that the count survives a settlement
-- the broker never received (a closed channel, a lost connection, an
-- expired ack deadline). Owned by package worker (worker/doc.go, "Attempts
-- and lost settlements"); created with the outbox schema next to
-- processed_messages, the other per-consumer table.

-- +goose Up
CREATE TABLE IF NOT EXISTS worker_attempts (
    consumer        TEXT        NOT NULL,
    message_id      TEXT        NOT NULL,
    -- The number of the last failed attempt (1-based); the next delivery
    -- of the message is attempt attempts+1 at least.
    attempts        INT         NOT NULL,
    last_error      TEXT        NOT NULL DEFAULT '',
    -- The worker decided to dead-letter the message but has not seen the
    -- DLQ copy confirmed: a redelivery goes to the DLQ without running the
    -- handler again.
    dead            BOOLEAN     NOT NULL DEFAULT false,
    first_failed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

-- Retention of records left behind (a message purged from the broker).
CREATE INDEX IF NOT EXISTS worker_attempts_updated_at_idx ON worker_attempts (updated_at);

-- +goose Down
DROP TABLE IF EXISTS worker_attempts;
