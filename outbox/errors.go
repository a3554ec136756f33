package outbox

import "errors"

// The errors that are part of the API; they are wrapped with %w, so test
// them with errors.Is.
var (
	// ErrInvalidEvent is returned by Enqueue for an event that cannot be
	// published; the message names the event index and the field.
	ErrInvalidEvent = errors.New("outbox: invalid event")
	// ErrInvalidConfig is returned by NewRelay for a RelayConfig it
	// refuses; the message names the field.
	ErrInvalidConfig = errors.New("outbox: invalid config")
	// ErrMigrate is returned by Migrate when the schema could not be
	// brought up to date.
	ErrMigrate = errors.New("outbox: migrate")
)
