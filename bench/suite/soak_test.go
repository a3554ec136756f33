package suite

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSoakFlatness: the last third's max against the first third's; a
// series that doubles grows, one within 1.5 times or within its noise
// floor stays flat, and fewer than 3 rows are not judged.
func TestSoakFlatness(t *testing.T) {
	row := func(heap uint64, gor, fds int, unpublished int64, elapsed float64) SoakRow {
		return SoakRow{Elapsed: elapsed, Committed: int64(elapsed * 200), Unpublished: unpublished,
			Relay:  ProcessStats{HeapInuse: heap, Goroutines: gor, OpenFiles: fds, RSS: 40 << 20},
			Worker: ProcessStats{HeapInuse: 8 << 20, Goroutines: 31, OpenFiles: 33, RSS: 40 << 20}}
	}
	require.Nil(t, soakFlatness([]SoakRow{row(1, 1, 1, 0, 1), row(1, 1, 1, 0, 2)}))
	rows := []SoakRow{
		row(10<<20, 15, 15, 3, 60), row(11<<20, 15, 16, 0, 120), // first third
		row(12<<20, 16, 15, 1, 180), row(15<<20, 15, 15, 2, 240),
		row(25<<20, 40, 18, 150, 300), row(21<<20, 15, 19, 0, 360), // last third
	}
	got := map[string]SoakFlatness{}
	for _, f := range soakFlatness(rows) {
		got[f.Series] = f
	}
	require.Len(t, got, len(soakSeries))
	heap := got["relay heap"]
	require.Equal(t, float64(11<<20), heap.First)
	require.Equal(t, float64(25<<20), heap.Last)
	require.InDelta(t, 25.0/11, heap.Ratio, 1e-9)
	require.False(t, heap.Flat, "from 11 to 25 MiB")
	require.False(t, got["relay goroutines"].Flat, "15 to 40")
	require.True(t, got["relay open files"].Flat, "16 to 19: within the noise of 5")
	require.True(t, got["outbox unpublished"].Flat, "3 to 150: within a second of production (200)")
	require.True(t, got["worker heap"].Flat)
	require.Equal(t, 1.0, got["worker goroutines"].Ratio)
	require.Zero(t, got["WAL retained"].Ratio, "0 to 0: no ratio")
	require.True(t, got["WAL retained"].Flat)
	require.NotEmpty(t, got["outbox rows"].Grows)
}
