package console

import "time"

// SetOverviewWait sets how long the overview waits for a DLQ's first
// reading, for a test, and returns what restores it.
func SetOverviewWait(d time.Duration) (restore func()) {
	prev := overviewWait
	overviewWait = d
	return func() { overviewWait = prev }
}
