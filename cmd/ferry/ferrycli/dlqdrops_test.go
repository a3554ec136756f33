package ferrycli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
)

// setRabbitPolicy sets an operator policy on the one queue named queue
// (the pattern matches nothing else) through the management HTTP API and
// removes it when the test ends.
func setRabbitPolicy(t *testing.T, queue string, definition map[string]any) {
	t.Helper()
	base, err := url.Parse(testenv.RabbitMQManagementURL())
	require.NoError(t, err)
	path := base.Scheme + "://" + base.Host + "/api/policies/%2F/" + url.PathEscape("ferry-test-"+queue)
	do := func(method string, body []byte) int {
		req, err := http.NewRequest(method, path, bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		if base.User != nil {
			pw, _ := base.User.Password()
			req.SetBasicAuth(base.User.Username(), pw)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	body, err := json.Marshal(map[string]any{"pattern": "^" + strings.ReplaceAll(queue, ".", `\.`) + "$",
		"definition": definition, "apply-to": "queues", "priority": 100})
	require.NoError(t, err)
	require.Contains(t, []int{http.StatusCreated, http.StatusNoContent}, do(http.MethodPut, body))
	t.Cleanup(func() { do(http.MethodDelete, nil) })
}

// TestDLQListShowsBrokerDrops: a message RabbitMQ drops by itself under
// an operator's policy (max-length here) appears in `ferry dlq list` with
// RabbitMQ's reason as its last error, and --error-contains finds it by
// that reason. It used to vanish: 0 in the queue, 0 in the DLQ.
func TestDLQListShowsBrokerDrops(t *testing.T) {
	base := testenv.UniqueName("cli-drop")
	tp := broker.Topology{Exchange: base + ".ex", Queues: []broker.Queue{{
		Name: base + ".work", Bindings: []string{"notification.requested"}, RetryDelays: []time.Duration{30 * time.Second},
	}}}
	q := tp.Queues[0].Name
	t.Cleanup(func() { deleteRabbit(t, tp.Exchange, rabbitQueues(q)...) })
	b := rabbitBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, b.Declare(ctx, tp))
	setRabbitPolicy(t, q, map[string]any{"max-length": 1})
	time.Sleep(500 * time.Millisecond)
	require.NoError(t, b.Publish(ctx, []*broker.Message{
		{ID: "first", Type: "notification.requested", Body: []byte("{}")},
		{ID: "second", Type: "notification.requested", Body: []byte("{}")},
	}))
	var out string
	require.Eventually(t, func() bool {
		code, o, errOut := run(t, append([]string{"dlq", "list", "--error-contains", "maxlen"}, rabbitArgs(q)...)...)
		require.Equal(t, 0, code, "stderr: %s", errOut)
		out = o
		return strings.Contains(o, "first")
	}, 10*time.Second, 300*time.Millisecond, "the dropped message never showed in ferry dlq list")
	t.Log(out)
	require.Contains(t, out, `dropped by the broker from queue "`+q+`"`)
	require.NotContains(t, out, "second", "the message RabbitMQ kept is not in the DLQ")
}
