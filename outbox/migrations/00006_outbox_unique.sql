-- Unique events (Event.UniqueKey, outbox/doc.go "Unique events"): one row
-- per unique key, naming the event enqueued under it and until when a
-- second Enqueue with the key returns that event instead of inserting
-- one. Enqueue upserts it (INSERT ... ON CONFLICT (unique_key) DO UPDATE)
-- in the caller's transaction: a concurrent Enqueue of the same key waits
-- on the primary key until the first transaction ends, then sees its row
-- (committed) or none (rolled back), so there is never a second event for
-- a key inside its window. The relay's retention deletes the rows whose
-- window has passed.

-- +goose Up
CREATE TABLE IF NOT EXISTS outbox_unique (
    unique_key TEXT        PRIMARY KEY,
    -- The outbox row id of the event enqueued under the key.
    event_id   BIGINT      NOT NULL,
    -- The end of the window: an Enqueue at or after it inserts a new
    -- event and takes the key over.
    expires_at TIMESTAMPTZ NOT NULL
);

CREATE INDEX IF NOT EXISTS outbox_unique_expires_at_idx ON outbox_unique (expires_at);

-- +goose Down
DROP TABLE IF EXISTS outbox_unique;
