package metrics

import "time"

// SetNow replaces m's clock (tests only).
func (m *Metrics) SetNow(now func() time.Time) { m.now = now }
