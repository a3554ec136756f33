-- Version 12. Flow control of package worker (worker/flow.go, docs/library.md
-- "Flow control"), created with the outbox schema next to worker_attempts.

-- +goose Up
-- The snoozes of a message ("come back later", worker.Snooze): deliveries
-- sent back through the broker's delayed retry without counting as a
-- failed attempt. The broker counts them (HeaderRetryCount, NATS
-- NumDelivered, SQS ApproximateReceiveCount); the worker subtracts this
-- count. Cleared with the attempt record (handled or dead-lettered); the
-- retention of worker_attempts applies.
ALTER TABLE worker_attempts ADD COLUMN IF NOT EXISTS snoozes INT NOT NULL DEFAULT 0;

-- Concurrency slots (worker.ConcurrencyLimit): at most n live rows per
-- (limit_name, key), slot in 0..n-1. A row whose expires_at passed is free
-- again: a worker killed while holding it gives it back within its lease;
-- a released slot is expired in place (holder '', expires_at -infinity),
-- an update of no indexed column (HOT), so the slots' churn leaves the
-- primary key alone. No index on expires_at for that reason: the rare
-- sweep of rows idle for an hour reads the table.
CREATE TABLE IF NOT EXISTS worker_flow_slots (
    limit_name  TEXT        NOT NULL,
    key         TEXT        NOT NULL,
    slot        INT         NOT NULL,
    holder      TEXT        NOT NULL,
    acquired_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (limit_name, key, slot)
);

-- Rate limits (worker.RateLimit), GCRA: the theoretical arrival time of
-- the next event per (limit_name, key), updated in place (HOT: no index on
-- tat).
CREATE TABLE IF NOT EXISTS worker_flow_rates (
    limit_name TEXT        NOT NULL,
    key        TEXT        NOT NULL,
    tat        TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (limit_name, key)
);

-- +goose Down
DROP TABLE IF EXISTS worker_flow_rates;
DROP TABLE IF EXISTS worker_flow_slots;
ALTER TABLE worker_attempts DROP COLUMN IF EXISTS snoozes;
