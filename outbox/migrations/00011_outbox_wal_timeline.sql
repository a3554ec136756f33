-- Version 11. Where a WAL relay's slot lives (outbox/wal.go, ensureSlot):
-- the server's system identifier (pg_control_system()) and WAL timeline
-- (the one pg_current_wal_lsn() is written on) when the slot was created.
-- Logical replication slots are not replicated to a standby before
-- PostgreSQL 17's failover slots, while this table is: after a promote the
-- new primary has the row and no slot. A promote (or a point-in-time
-- recovery) starts a new timeline, and a standby made by pg_basebackup
-- shares the system identifier, so a missing slot registered on another
-- timeline or system was lost with its server, not dropped: the relay hands
-- the rows left to the polling side and creates a new slot by itself. A slot
-- missing on the same timeline stays ErrSlotLost. NULL in a row written
-- before this version: filled in at the next start that finds its slot.

-- +goose Up
ALTER TABLE outbox_wal_slots ADD COLUMN IF NOT EXISTS system_identifier BIGINT;
ALTER TABLE outbox_wal_slots ADD COLUMN IF NOT EXISTS timeline_id BIGINT;

-- +goose Down
ALTER TABLE outbox_wal_slots DROP COLUMN IF EXISTS timeline_id;
ALTER TABLE outbox_wal_slots DROP COLUMN IF EXISTS system_identifier;
