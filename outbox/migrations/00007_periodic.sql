-- Version 7. Periodic jobs (package ferry, ferry.Periodic and
-- ferry.Scheduler; doc.go "Periodic jobs"): one row per job name holding
-- the latest tick enqueued. A scheduler enqueues a tick in one transaction
-- that locks the job's row (SELECT ... FOR UPDATE), moves last_tick to
-- the tick and inserts the outbox event, so across replicas a tick is
-- enqueued once: a replica racing for it waits for the lock and then finds
-- last_tick at the tick. A replica killed mid-transaction leaves nothing:
-- the tick is taken by the next one.

-- +goose Up
CREATE TABLE IF NOT EXISTS ferry_periodic (
    name       TEXT        PRIMARY KEY,
    -- The latest tick enqueued; at registration, the time the first
    -- scheduler started (ticks after it are due).
    last_tick  TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE IF EXISTS ferry_periodic;
