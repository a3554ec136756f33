package metrics_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/metrics"
)

// TestPackageDocListsEverySeries keeps the package doc's table true: every
// series ferry exports and every outcome label value is in it.
func TestPackageDocListsEverySeries(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	for _, name := range []string{
		metrics.OutboxUnprocessedRows, metrics.OutboxOldestAgeSeconds, metrics.OutboxParkedRows,
		metrics.RelayPublishedTotal, metrics.RelayPublishErrorsTotal, metrics.RelayBatchDuration, metrics.RelayBlocked,
		metrics.WorkerMessagesTotal, metrics.WorkerHandlerDuration, metrics.WorkerEndToEndLatency,
	} {
		listed := strings.Contains(string(doc), "//\t"+name+" ") || strings.Contains(string(doc), "//\t"+name+"{")
		require.True(t, listed, "doc.go's table lacks %s", name)
	}
	_, outcomes, ok := strings.Cut(string(doc), "deliveries settled, by outcome:")
	require.True(t, ok)
	outcomes, _, _ = strings.Cut(outcomes, metrics.WorkerHandlerDuration)
	for _, o := range []string{metrics.OutcomeAck, metrics.OutcomeRetry, metrics.OutcomeDead, metrics.OutcomeDuplicate, metrics.OutcomeUnsettled, metrics.OutcomeSnoozed} {
		require.Contains(t, outcomes, o, "doc.go lists the outcome %s", o)
	}
}
