package ferrycli

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseSince(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	got, err := parseSince("2026-12-01T09:00:00Z", now)
	require.NoError(t, err)
	require.Equal(t, now.Add(-time.Hour), got)
	got, err = parseSince("90m", now)
	require.NoError(t, err)
	require.Equal(t, now.Add(-90*time.Minute), got)
	for _, bad := range []string{"", "yesterday", "-5m", "0s"} {
		_, err := parseSince(bad, now)
		require.ErrorIs(t, err, ErrUsage, "%q", bad)
	}
}
