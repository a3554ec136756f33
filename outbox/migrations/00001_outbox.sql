-- The transactional outbox and the consumers' deduplication table.
-- Owned by package outbox; version table ferry_outbox_migrations.

-- +goose Up
CREATE TABLE IF NOT EXISTS outbox (
    id              BIGSERIAL PRIMARY KEY,
    event_type      TEXT        NOT NULL,
    partition_key   TEXT        NOT NULL DEFAULT '',
    payload         BYTEA       NOT NULL,
    headers         JSONB       NOT NULL DEFAULT '{}',
    occurred_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    processed_at    TIMESTAMPTZ,
    attempts        INT         NOT NULL DEFAULT 0,
    last_error      TEXT,
    -- A row whose publication failed for a reason of its own (unroutable,
    -- too large, nacked) is not claimed again before this time.
    next_attempt_at TIMESTAMPTZ
);

-- The relay's claim query walks this index in id order; it holds only the
-- rows still to publish, so it stays small however large the table grows.
CREATE INDEX IF NOT EXISTS outbox_unprocessed_idx ON outbox (id) WHERE processed_at IS NULL;

-- Retention and the "processed in the last minute/hour" statistics.
CREATE INDEX IF NOT EXISTS outbox_processed_at_idx ON outbox (processed_at) WHERE processed_at IS NOT NULL;

CREATE TABLE IF NOT EXISTS processed_messages (
    consumer     TEXT        NOT NULL,
    message_id   TEXT        NOT NULL,
    processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

CREATE INDEX IF NOT EXISTS processed_messages_processed_at_idx ON processed_messages (processed_at);

-- +goose Down
DROP TABLE IF EXISTS processed_messages;
DROP TABLE IF EXISTS outbox;
