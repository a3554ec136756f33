package ferrycli

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseRetryDelays(t *testing.T) {
	d, err := parseRetryDelays("30s")
	require.NoError(t, err)
	require.Equal(t, []time.Duration{30 * time.Second}, d)
	d, err = parseRetryDelays("1s, 10s,1m")
	require.NoError(t, err)
	require.Equal(t, []time.Duration{time.Second, 10 * time.Second, time.Minute}, d)
	for _, bad := range []string{"", "1s,", "x", "-1s", "1s,,2s"} {
		_, err := parseRetryDelays(bad)
		require.ErrorIs(t, err, ErrUsage, bad)
	}
}

func TestParseRetention(t *testing.T) {
	for in, want := range map[string]time.Duration{"7d": 7 * 24 * time.Hour, "72h": 72 * time.Hour, "-1s": -time.Second, "1s": time.Second, "-1d": -24 * time.Hour} {
		got, err := parseRetention(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "d", "1w", "7 d"} {
		_, err := parseRetention(bad)
		require.ErrorIs(t, err, ErrUsage, bad)
	}
	// 0 used to mean the default 7d silently.
	for _, zero := range []string{"0", "0s", "0d"} {
		_, err := parseRetention(zero)
		require.ErrorIs(t, err, ErrUsage, zero)
		require.ErrorContains(t, err, "use a negative value to keep rows forever", zero)
	}
}

func TestCheckRetention(t *testing.T) {
	require.NoError(t, checkRetention(-time.Second, 0))
	require.NoError(t, checkRetention(time.Hour, 0))
	require.NoError(t, checkRetention(10*time.Hour, 10*time.Hour))
	err := checkRetention(time.Second, 0)
	require.ErrorIs(t, err, ErrUsage)
	require.ErrorContains(t, err, "--retention 1s: must be at least 1h0m0s")
	err = checkRetention(2*time.Hour, 5*time.Hour)
	require.ErrorIs(t, err, ErrUsage)
	require.ErrorContains(t, err, "--retention 2h0m0s: must be at least 5h0m0s, the longest --retry-delay times --max-attempts")
}

func TestProgressFraction(t *testing.T) {
	c := demoCounts{lines: 10, posted: 10, accepted: 8, rejected: 2, sent: 4, dead: 0}
	require.InDelta(t, 0.5, c.fraction(), 1e-9)
	require.Equal(t, "posted 10/10  accepted 8  rejected 2  sent 4  dead 0", c.describe())
	// Still posting: half the lines posted, so at most half the bar.
	c.posted = 5
	require.InDelta(t, 0.25, c.fraction(), 1e-9)
	require.Zero(t, demoCounts{lines: 3}.fraction(), "nothing accepted yet")
}

func TestReadLines(t *testing.T) {
	lines, name, err := readLines("")
	require.NoError(t, err)
	require.Equal(t, "built-in sample", name)
	require.Len(t, lines, 55)
}
