-- The WAL relay (RelayConfig.Mode "wal", outbox/wal.go): one row per
-- logical replication slot it created. A slot found missing at start-up
-- while its row is here was dropped or invalidated after the relay began
-- streaming from it, so the relay refuses to create a new one (which would
-- skip the events committed meanwhile without a word) and names what to
-- do (ResetWALSlot, `ferry outbox wal-reset`). Rows of the outbox read from
-- the WAL are deleted once confirmed, so the rows left are exactly the
-- events not yet confirmed: a reset hands them to the polling relay.

-- +goose Up
CREATE TABLE IF NOT EXISTS outbox_wal_slots (
    slot_name   TEXT        PRIMARY KEY,
    destination TEXT        NOT NULL,
    publication TEXT        NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE IF EXISTS outbox_wal_slots;
