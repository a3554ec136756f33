-- Scheduled events (Event.DueAt, outbox/doc.go "Scheduled events"): the
-- relay's claim wants the unprocessed rows with next_attempt_at IS NULL OR
-- next_attempt_at <= now(), in id order. With only outbox_unprocessed_idx
-- it reads every waiting row (a scheduled event, a parked row) on each
-- claim; with these two the planner can combine the rows without
-- next_attempt_at and the rows whose next_attempt_at has passed
-- (BitmapOr) and never read the ones still waiting.

-- +goose Up
CREATE INDEX IF NOT EXISTS outbox_ready_idx ON outbox (id) WHERE processed_at IS NULL AND next_attempt_at IS NULL;
CREATE INDEX IF NOT EXISTS outbox_waiting_idx ON outbox (next_attempt_at) WHERE processed_at IS NULL AND next_attempt_at IS NOT NULL;

-- +goose Down
DROP INDEX IF EXISTS outbox_waiting_idx;
DROP INDEX IF EXISTS outbox_ready_idx;
