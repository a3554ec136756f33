-- Per-key order: the relay checks, for each key of a claimed batch, that no
-- lower unprocessed row of that key was left behind (outbox/relay.go,
-- claimSQL, "overtaken"); this index makes that an index probe per key.

-- +goose Up
CREATE INDEX IF NOT EXISTS outbox_unprocessed_key_idx ON outbox (partition_key, id) WHERE processed_at IS NULL;

-- +goose Down
DROP INDEX IF EXISTS outbox_unprocessed_key_idx;
