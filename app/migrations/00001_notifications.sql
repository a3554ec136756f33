-- +goose Up
CREATE TABLE notifications (
    id              BIGSERIAL PRIMARY KEY,
    user_id         TEXT        NOT NULL,
    channel         TEXT        NOT NULL,
    to_addr         TEXT        NOT NULL,
    subject         TEXT        NOT NULL DEFAULT '',
    body            TEXT        NOT NULL,
    status          TEXT        NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'sent', 'dead')),
    attempts        INT         NOT NULL DEFAULT 0,
    last_error      TEXT,
    -- "<message id>/<attempt>" of the last failure OnFailure recorded, so a
    -- repeated call for the same attempt does not count it twice.
    last_failure_key TEXT,
    -- The client's Idempotency-Key header and the SHA-256 of the normalized
    -- request it came with; NULL when the request had no key. NULLs are
    -- distinct, so any number of key-less requests coexist.
    idempotency_key TEXT,
    request_hash    BYTEA,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    sent_at         TIMESTAMPTZ,
    CONSTRAINT notifications_idempotency_key_key UNIQUE NULLS DISTINCT (idempotency_key)
);

CREATE INDEX notifications_status_idx ON notifications (status);

-- +goose Down
DROP TABLE notifications;
