-- Version 9. The web console (package console, outbox/rows.go ListRows):
-- its pages stay on index scans with a large backlog.
--
-- outbox_parked_idx holds only the parked rows (unprocessed, with failed
-- publications): the parked list and its count read it instead of
-- filtering every unprocessed row. It is small (a parked row is rare) and
-- changes only when a publication fails or a parked row goes.
--
-- outbox_app_id_idx finds a job by its application id (the x-app-id
-- header, Event.AppID; JobGetByAppID and the console's search) without
-- reading the whole table. Partial: rows without an app id are not in it.

-- +goose Up
CREATE INDEX IF NOT EXISTS outbox_parked_idx ON outbox (id) WHERE processed_at IS NULL AND attempts > 0;
CREATE INDEX IF NOT EXISTS outbox_app_id_idx ON outbox ((headers->>'x-app-id')) WHERE headers ? 'x-app-id';

-- +goose Down
DROP INDEX IF EXISTS outbox_app_id_idx;
DROP INDEX IF EXISTS outbox_parked_idx;
