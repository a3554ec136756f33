package ferrycli_test

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// --smtp-timeout and --smtp-data-timeout exist on the commands that send
// mail, with their env vars and defaults (10s, and RFC 5321's 10 minutes
// for the reply to the end of the data).
func TestSMTPTimeoutFlags(t *testing.T) {
	for _, cmd := range []string{"worker", "run", "demo"} {
		code, out, errOut := run(t, cmd, "--help")
		require.Equal(t, 0, code, "%s: %s", cmd, errOut)
		require.Contains(t, out, "--smtp-timeout value", cmd)
		require.Contains(t, out, "(default: 10s)", cmd)
		require.Contains(t, out, "--smtp-data-timeout value", cmd)
		require.Contains(t, out, "(default: 10m0s)", cmd)
		require.Contains(t, out, "$FERRY_SMTP_TIMEOUT", cmd)
		require.Contains(t, out, "$FERRY_SMTP_DATA_TIMEOUT", cmd)
	}
	for _, args := range [][]string{
		{"worker", "--smtp-timeout", "0"},
		{"worker", "--smtp-data-timeout", "-1s"},
		{"run", "--smtp-data-timeout", "0s"},
	} {
		code, _, errOut := run(t, args...)
		require.Equal(t, 2, code, "%v: %s", args, errOut)
		require.Contains(t, errOut, args[1]+" ", "%v", args)
		require.Contains(t, errOut, "must be positive", "%v", args)
	}
	t.Setenv("FERRY_SMTP_DATA_TIMEOUT", "soon")
	code, _, errOut := run(t, "worker")
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, "smtp-data-timeout")
}
