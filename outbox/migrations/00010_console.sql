-- Version 10. The web console (package console, outbox/rows.go ListRows):
-- its pages stay on index scans with a large backlog.
--
-- outbox_parked_idx holds only the parked rows (unprocessed, with failed
-- publications), outbox_scheduled_idx only the scheduled ones (never
-- failed, with a due time; enqueueSQL sets next_attempt_at to Event.DueAt):
-- their lists and capped counts (outbox.ReadBacklog) read them instead of
-- filtering every unprocessed row. Both are small next to the backlog and
-- change only when a row enters or leaves that state.
--
-- outbox_app_id_idx finds a job by its application id (the x-app-id
-- header, Event.AppID; JobGetByAppID and the console's search) without
-- reading the whole table. Partial: rows without an app id are not in it.

-- +goose Up
CREATE INDEX IF NOT EXISTS outbox_parked_idx ON outbox (destination, id) WHERE processed_at IS NULL AND attempts > 0;
CREATE INDEX IF NOT EXISTS outbox_scheduled_idx ON outbox (destination, next_attempt_at) WHERE processed_at IS NULL AND attempts = 0 AND next_attempt_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS outbox_app_id_idx ON outbox ((headers->>'x-app-id')) WHERE headers ? 'x-app-id';

-- +goose Down
DROP INDEX IF EXISTS outbox_app_id_idx;
DROP INDEX IF EXISTS outbox_scheduled_idx;
DROP INDEX IF EXISTS outbox_parked_idx;
