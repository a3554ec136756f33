-- Destinations (Event.Destination, outbox/doc.go "Destinations"): every
-- row names the outbox it belongs to, and a relay claims only the rows of
-- its RelayConfig.Destination, so several services (or exchanges) can
-- share one database without one relay publishing, and parking as
-- unroutable, another's events. Existing rows, and rows inserted by code
-- that does not name a destination, belong to 'default'
-- (DefaultDestination); ADD COLUMN with a constant default does not
-- rewrite the table.
--
-- The claim's indexes gain destination as their first column, so a
-- relay's claim walks only its own destination's rows, as cheaply as the
-- one-destination claim walked all of them (outbox/relay.go, claimSQL).
-- outbox_unprocessed_idx (id) goes too: left in place, the planner may
-- walk it in id order and filter out the other destinations' rows (a
-- parked or scheduled backlog of another service) on every claim.

-- +goose Up
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS destination TEXT NOT NULL DEFAULT 'default';

CREATE INDEX IF NOT EXISTS outbox_unprocessed_dest_idx ON outbox (destination, id) WHERE processed_at IS NULL;
CREATE INDEX IF NOT EXISTS outbox_unprocessed_dest_key_idx ON outbox (destination, partition_key, id) WHERE processed_at IS NULL;
CREATE INDEX IF NOT EXISTS outbox_ready_dest_idx ON outbox (destination, id) WHERE processed_at IS NULL AND next_attempt_at IS NULL;
CREATE INDEX IF NOT EXISTS outbox_waiting_dest_idx ON outbox (destination, next_attempt_at) WHERE processed_at IS NULL AND next_attempt_at IS NOT NULL;
DROP INDEX IF EXISTS outbox_unprocessed_idx;
DROP INDEX IF EXISTS outbox_unprocessed_key_idx;
DROP INDEX IF EXISTS outbox_ready_idx;
DROP INDEX IF EXISTS outbox_waiting_idx;

-- +goose Down
CREATE INDEX IF NOT EXISTS outbox_unprocessed_idx ON outbox (id) WHERE processed_at IS NULL;
CREATE INDEX IF NOT EXISTS outbox_unprocessed_key_idx ON outbox (partition_key, id) WHERE processed_at IS NULL;
CREATE INDEX IF NOT EXISTS outbox_ready_idx ON outbox (id) WHERE processed_at IS NULL AND next_attempt_at IS NULL;
CREATE INDEX IF NOT EXISTS outbox_waiting_idx ON outbox (next_attempt_at) WHERE processed_at IS NULL AND next_attempt_at IS NOT NULL;
DROP INDEX IF EXISTS outbox_waiting_dest_idx;
DROP INDEX IF EXISTS outbox_ready_dest_idx;
DROP INDEX IF EXISTS outbox_unprocessed_dest_key_idx;
DROP INDEX IF EXISTS outbox_unprocessed_dest_idx;
ALTER TABLE outbox DROP COLUMN IF EXISTS destination;
