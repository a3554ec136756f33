package e2e

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/internal/testenv"
)

// TestDemoSQSFile runs the demo on the shared 1,000-line sample with the
// real PostgreSQL, ElasticMQ and Mailpit: 968 accepted and sent, 32
// rejected, nothing dead, exit 0 (issue 9, "done when").
func TestDemoSQSFile(t *testing.T) {
	file := filepath.Join(testenv.RepoRoot(), "..", "shared", "data", "notifications-1000.ndjson")
	args := []string{"demo", "--broker=sqs", "--sqs-endpoint", testenv.SQSEndpoint(), "--aws-region", testenv.AWSRegion(),
		"--database-url", testenv.NewDatabase(t), "--smtp-addr", testenv.SMTPAddr(),
		"--exchange", testenv.UniqueName("e2e-demo-ex"), "--queue", testenv.UniqueName("e2e-demo-q"),
		"--file", file}
	code, out, errOut := ferry(t, args...)
	t.Logf("%s", out)
	require.Equal(t, 0, code, "stderr:\n%s", tail(errOut, 8<<10))
	require.Equal(t, 968, summaryCount(t, out, "accepted"))
	require.Equal(t, 32, summaryCount(t, out, "rejected"))
	require.Equal(t, 968, summaryCount(t, out, "sent"))
	require.Equal(t, 0, summaryCount(t, out, "dead"))
	require.Contains(t, out, "OK: all ")
}
