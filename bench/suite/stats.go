package suite

import (
	"slices"
	"time"
)

// Percentile returns the p-th percentile (0 < p <= 100) of sorted by the
// nearest-rank method: the smallest value such that at least p % of the
// values are at most it. sorted must be in ascending order; an empty slice
// gives 0. p <= 0 gives the smallest value, p >= 100 the largest.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p/100+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// LatencyStats are the percentiles of a set of latencies, in milliseconds.
type LatencyStats struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50_ms"`
	P95   float64 `json:"p95_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
}

// Summarize sorts ds in place and returns its p50, p95, p99 and maximum in
// milliseconds (all 0 for no values).
func Summarize(ds []time.Duration) LatencyStats {
	slices.Sort(ds)
	s := LatencyStats{Count: len(ds)}
	if len(ds) == 0 {
		return s
	}
	s.P50, s.P95, s.P99 = ms(Percentile(ds, 50)), ms(Percentile(ds, 95)), ms(Percentile(ds, 99))
	s.Max = ms(ds[len(ds)-1])
	return s
}

// ms converts d to milliseconds with microsecond precision.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// OrderCounter counts per-key order violations of a consumer: messages
// handled after a message of the same key that was published later. Feed it
// each handled message's key and its sequence number within the key (as
// published: 1, 2, 3, ...) in the order the handler started on them.
//
// A violation is a message whose sequence is lower than the highest
// sequence already seen for its key: for the arrival order 1 3 2 4 that is
// one violation (2). A redelivered duplicate of an already seen sequence
// counts as a violation too when a later one was seen. The zero value is
// not usable; create it with NewOrderCounter. It is not safe for
// concurrent use.
type OrderCounter struct {
	highest    map[string]int
	violations int
	seen       int
}

// NewOrderCounter returns an empty OrderCounter.
func NewOrderCounter() *OrderCounter { return &OrderCounter{highest: map[string]int{}} }

// Observe records that the message seq of key was handled now.
func (c *OrderCounter) Observe(key string, seq int) {
	c.seen++
	if h, ok := c.highest[key]; ok && seq < h {
		c.violations++
		return
	}
	c.highest[key] = seq
}

// Violations returns the violations counted so far.
func (c *OrderCounter) Violations() int { return c.violations }

// Seen returns how many messages were observed.
func (c *OrderCounter) Seen() int { return c.seen }

// CPUShare is the CPU time one process tree used during a run.
type CPUShare struct {
	Name string
	CPU  time.Duration
}

// CPUPerThousand returns, for a run that moved events events, each
// process's CPU seconds per 1,000 events, keyed by name, plus the key
// "all" with their sum. CPU time measured from /proc (utime+stime) does
// not grow while a process waits for a core, so unlike throughput it is
// barely moved by other work on a shared machine. Shares with the same
// name are added (the embedded NATS server, for one, runs inside the ferry
// process and is then counted once, as ferry's). It returns nil for
// events <= 0.
func CPUPerThousand(shares []CPUShare, events int) map[string]float64 {
	if events <= 0 {
		return nil
	}
	k := float64(events) / 1000
	out := map[string]float64{}
	var all time.Duration
	for _, s := range shares {
		out[s.Name] += s.CPU.Seconds() / k
		all += s.CPU
	}
	out["all"] = all.Seconds() / k
	return out
}

// DelayError compares observed retry delays with the requested ones: the
// median and maximum of |observed - requested|, in milliseconds. observed
// and requested are pairs at the same index; extra values of the longer
// slice are ignored.
func DelayError(observed, requested []time.Duration) (median, maximum float64) {
	n := min(len(observed), len(requested))
	if n == 0 {
		return 0, 0
	}
	errs := make([]time.Duration, n)
	for i := range n {
		d := observed[i] - requested[i]
		if d < 0 {
			d = -d
		}
		errs[i] = d
	}
	slices.Sort(errs)
	return ms(Percentile(errs, 50)), ms(errs[n-1])
}
