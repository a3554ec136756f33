package suite

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPercentileNearestRank(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	// 1..100 ms: the p-th percentile is p ms by nearest rank.
	var hundred []time.Duration
	for i := 1; i <= 100; i++ {
		hundred = append(hundred, time.Duration(i)*time.Millisecond)
	}
	require.Equal(t, 50*time.Millisecond, Percentile(hundred, 50))
	require.Equal(t, 95*time.Millisecond, Percentile(hundred, 95))
	require.Equal(t, 99*time.Millisecond, Percentile(hundred, 99))
	require.Equal(t, 100*time.Millisecond, Percentile(hundred, 100))
	require.Equal(t, 1*time.Millisecond, Percentile(hundred, 0))

	// Four values: p50 is the 2nd (rank ceil(0.5*4) = 2), p99 the 4th.
	four := ms(10, 20, 30, 40)
	require.Equal(t, 20*time.Millisecond, Percentile(four, 50))
	require.Equal(t, 40*time.Millisecond, Percentile(four, 99))
	require.Equal(t, 10*time.Millisecond, Percentile(four, 25))
	require.Equal(t, 30*time.Millisecond, Percentile(four, 51))

	require.Equal(t, time.Duration(0), Percentile(nil, 50))
	require.Equal(t, 7*time.Millisecond, Percentile(ms(7), 99))
}

func TestSummarizeSortsAndReportsMilliseconds(t *testing.T) {
	ds := []time.Duration{3 * time.Millisecond, 1 * time.Millisecond, 2500 * time.Microsecond, 10 * time.Millisecond}
	s := Summarize(ds)
	require.Equal(t, LatencyStats{Count: 4, P50: 2.5, P95: 10, P99: 10, Max: 10}, s)
	require.Equal(t, time.Millisecond, ds[0], "sorted in place")
	require.Equal(t, LatencyStats{}, Summarize(nil))
}

func TestOrderCounter(t *testing.T) {
	cases := []struct {
		name       string
		keys       []string
		seqs       []int
		violations int
	}{
		{"in order", []string{"a", "a", "a"}, []int{1, 2, 3}, 0},
		{"one late", []string{"a", "a", "a", "a"}, []int{1, 3, 2, 4}, 1},
		{"reversed", []string{"a", "a", "a"}, []int{3, 2, 1}, 2},
		{"keys are independent", []string{"a", "b", "a", "b"}, []int{2, 1, 3, 2}, 0},
		{"interleaved keys, one violation each", []string{"a", "b", "a", "b"}, []int{2, 2, 1, 1}, 2},
		{"redelivered duplicate after a later one", []string{"a", "a", "a"}, []int{1, 2, 1}, 1},
		{"repeat of the highest is no violation", []string{"a", "a"}, []int{1, 1}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			oc := NewOrderCounter()
			for i := range c.keys {
				oc.Observe(c.keys[i], c.seqs[i])
			}
			require.Equal(t, c.violations, oc.Violations())
			require.Equal(t, len(c.keys), oc.Seen())
		})
	}
}

func TestCPUPerThousand(t *testing.T) {
	shares := []CPUShare{
		{Name: "ferry", CPU: 2 * time.Second},
		{Name: "postgres", CPU: 3 * time.Second},
		{Name: "broker", CPU: 500 * time.Millisecond},
		{Name: "ferry", CPU: time.Second}, // same name: added
	}
	got := CPUPerThousand(shares, 2000)
	require.InDelta(t, 1.5, got["ferry"], 1e-9)
	require.InDelta(t, 1.5, got["postgres"], 1e-9)
	require.InDelta(t, 0.25, got["broker"], 1e-9)
	require.InDelta(t, 3.25, got["all"], 1e-9)
	require.Len(t, got, 4)
	require.Nil(t, CPUPerThousand(shares, 0))
}

func TestDelayError(t *testing.T) {
	obs := []time.Duration{1010 * time.Millisecond, 990 * time.Millisecond, 1300 * time.Millisecond}
	req := []time.Duration{time.Second, time.Second, time.Second}
	med, worst := DelayError(obs, req)
	require.InDelta(t, 10, med, 1e-9) // errors 10, 10, 300 ms
	require.InDelta(t, 300, worst, 1e-9)
	med, worst = DelayError(nil, req)
	require.Zero(t, med)
	require.Zero(t, worst)
}

func TestCDFEndsAtOne(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 1001; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	pts := cdf(ds)
	require.LessOrEqual(t, len(pts), 202)
	require.Equal(t, Point{X: 1001, Y: 1}, pts[len(pts)-1])
	require.InDelta(t, 1.0/1001, pts[0].Y, 1e-9)
	for i := 1; i < len(pts); i++ {
		require.GreaterOrEqual(t, pts[i].X, pts[i-1].X)
		require.Greater(t, pts[i].Y, pts[i-1].Y)
	}
}

func TestFormatValue(t *testing.T) {
	require.Equal(t, "15002", formatValue(15002.4))
	require.Equal(t, "3", formatValue(3))
	require.Equal(t, "2.58", formatValue(2.5812))
	require.Equal(t, "0.131", formatValue(0.1312))
	require.Equal(t, "0.490", formatValue(0.49))
	require.Equal(t, "0.00389", formatValue(0.003892239646160032))
	require.Equal(t, "-0.0500", formatValue(-0.05))
	require.Equal(t, "4.2e-05", formatValue(0.000042))
}

// Durations keep their meaning at every size: 0.49 s is not "0 s".
func TestFormatSeconds(t *testing.T) {
	for sec, want := range map[float64]string{
		0: "0 s", 0.0035: "3.5 ms", 0.04: "40 ms", 0.49: "490 ms", 2.0771: "2.08 s", 15.655: "15.7 s", 319.4: "319 s",
	} {
		require.Equal(t, want, FormatSeconds(sec), "%v s", sec)
	}
}

func TestRecovery(t *testing.T) {
	// Samples every 0.5 s; the lag is 2 events until the fault at 2 s,
	// grows to 40 and is back to 3 at 4 s.
	series := []Point{{X: 0}, {X: 0.5}, {X: 1}, {X: 1.5}, {X: 2}, {X: 2.5}, {X: 3}, {X: 3.5}, {X: 4}, {X: 4.5}}
	lags := []float64{2, 2, 2, 2, 10, 40, 30, 20, 3, 2}
	require.InDelta(t, 2.0, recovery(series, lags, 2, 5), 1e-9)
	// A fault that never shows: the lag stays within the slack.
	flat := []float64{2, 2, 2, 2, 3, 4, 3, 2, 2, 2}
	require.Zero(t, recovery(series, flat, 2, 5))
	// Never caught up.
	stuck := []float64{2, 2, 2, 2, 10, 40, 50, 60, 70, 80}
	require.Equal(t, -1.0, recovery(series, stuck, 2, 5))
}
