package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/rabbitmq"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/worker"
	"github.com/ferrymq/ferry/worker/workertest"
)

// rabbitEnv reads the rabbit application's setting key ("undefined" when
// unset) and returns a func that restores it.
func rabbitEnv(t *testing.T, key string) (restore func()) {
	t.Helper()
	out, err := exec.Command("bash", filepath.Join(testenv.RepoRoot(), "compose", "local", "services.sh"),
		"rabbitmqctl", "eval", fmt.Sprintf("application:get_env(rabbit, %s).", key)).CombinedOutput()
	require.NoError(t, err, "%s", out)
	v := strings.TrimSpace(string(out))
	return func() {
		if v == "undefined" {
			testenv.Services(t, "rabbitmqctl", "eval", fmt.Sprintf("application:unset_env(rabbit, %s).", key))
			return
		}
		inner := strings.TrimSuffix(strings.TrimPrefix(v, "{ok,"), "}")
		testenv.Services(t, "rabbitmqctl", "eval", fmt.Sprintf("application:set_env(rabbit, %s, %s).", key, inner))
	}
}

// closedChannels is a slog.Handler that signals the adapter's log line
// for a channel the server closed, with its reason.
type closedChannels struct {
	mu      sync.Mutex
	reasons []string
	ch      chan struct{}
}

func (c *closedChannels) Enabled(context.Context, slog.Level) bool { return true }
func (c *closedChannels) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *closedChannels) WithGroup(string) slog.Handler            { return c }
func (c *closedChannels) Handle(_ context.Context, r slog.Record) error {
	if !strings.Contains(r.Message, "closed the consuming channel") {
		return nil
	}
	var reason string
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "reason" {
			reason = a.Value.String()
		}
		return true
	})
	c.mu.Lock()
	c.reasons = append(c.reasons, reason)
	c.mu.Unlock()
	select {
	case c.ch <- struct{}{}:
	default:
	}
	return nil
}

// closeConnections closes, through the management API, every connection
// whose client-provided name starts with prefix; it waits for them to be
// listed (the API lists a connection after its first statistics event).
func closeConnections(t *testing.T, prefix string) error {
	base, err := url.Parse(testenv.RabbitMQManagementURL())
	if err != nil {
		return err
	}
	pw, _ := base.User.Password()
	do := func(method, path string, v any) error {
		req, _ := http.NewRequest(method, base.Scheme+"://"+base.Host+path, nil)
		req.SetBasicAuth(base.User.Username(), pw)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("%s %s: %s", method, path, resp.Status)
		}
		if v != nil {
			return json.NewDecoder(resp.Body).Decode(v)
		}
		return nil
	}
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		var conns []struct {
			Name       string         `json:"name"`
			ClientProp map[string]any `json:"client_properties"`
		}
		if err := do(http.MethodGet, "/api/connections", &conns); err != nil {
			return err
		}
		closed := 0
		for _, c := range conns {
			if name, _ := c.ClientProp["connection_name"].(string); strings.HasPrefix(name, prefix) {
				if err := do(http.MethodDelete, "/api/connections/"+url.PathEscape(c.Name), nil); err != nil {
					return err
				}
				closed++
			}
		}
		if closed > 0 {
			return nil
		}
	}
	return errors.New("no connection of ours listed by the management API")
}

// TestWorkerRabbitMQConsumerTimeout: a handler slower than RabbitMQ's
// consumer_timeout, which then fails, cannot publish its retry copy (the
// server closed the channel); the original comes back without ferry's
// retry header. The attempt count must still advance and the message
// reach the DLQ after the policy's 3 attempts. The first attempt meets the
// real consumer_timeout (lowered to 3 s at run time, with the channel tick
// that checks it lowered to 1 s; both restored afterwards); the later ones
// lose their channel by a connection closed through the management API,
// to keep the test fast. With two handlers the redelivered copy races the
// attempt it replaces, as in production.
func TestWorkerRabbitMQConsumerTimeout(t *testing.T) {
	testenv.RequireTCP(t, "rabbitmq", testenv.HostPort(testenv.RabbitMQURL()))
	t.Cleanup(rabbitEnv(t, "consumer_timeout"))
	t.Cleanup(rabbitEnv(t, "channel_tick_interval"))
	testenv.Services(t, "rabbitmqctl", "eval", "application:set_env(rabbit, consumer_timeout, 3000).")
	testenv.Services(t, "rabbitmqctl", "eval", "application:set_env(rabbit, channel_tick_interval, 1000).")

	logs := &closedChannels{ch: make(chan struct{}, 1)}
	connName := testenv.UniqueName("ferry-ct")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := rabbitmq.New(ctx, rabbitmq.Config{URL: testenv.RabbitMQURL(), ConnectionName: connName, Logger: slog.New(logs)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	pool, _ := testenv.NewPool(t)
	workertest.CreateSchema(t, pool)
	typ := "ferry.test.slow"
	topo := broker.Topology{Exchange: testenv.UniqueName("ct-ex"), Queues: []broker.Queue{{
		Name: testenv.UniqueName("ct-q"), Bindings: []string{typ}, RetryDelays: []time.Duration{150 * time.Millisecond},
	}}}
	queue := topo.Queues[0].Name
	require.NoError(t, b.Declare(ctx, topo))

	var (
		mu       sync.Mutex
		attempts []int
		outs     []worker.Outcome
	)
	handler := func(ctx context.Context, _ pgx.Tx, msg *broker.Message) error {
		mu.Lock()
		attempts = append(attempts, msg.Attempt)
		n := len(attempts)
		mu.Unlock()
		if n == 1 {
			select { // slower than consumer_timeout: the server closes the channel
			case <-logs.ch:
			case <-time.After(90 * time.Second):
				return errors.New("test: the consumer timeout never closed the channel")
			}
		} else if err := closeConnections(t, connName); err != nil {
			return fmt.Errorf("test: close the connection: %w", err)
		}
		return fmt.Errorf("smtp: 451 try later (attempt %d)", msg.Attempt)
	}
	w, err := worker.New(worker.Config{
		Consumer: "ct", Queue: queue, Pool: pool, Broker: b, Handler: handler, Topology: topo,
		// Two handlers: the copy RabbitMQ redelivers when it closes the
		// channel reaches the second while the first attempt still runs, and
		// waits on its dedup row; it must see the attempt the first one
		// records before rolling back.
		Concurrency: 2,
		Policy:      worker.BackoffPolicy{MaxAttempts: 3, Delays: []time.Duration{150 * time.Millisecond}},
		OnOutcome: func(_ *broker.Message, o worker.Outcome, _ time.Duration) {
			mu.Lock()
			outs = append(outs, o)
			mu.Unlock()
		},
	})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	defer func() { stop(); require.NoError(t, <-done) }()

	require.NoError(t, b.Publish(ctx, []*broker.Message{{ID: "1", Type: typ, Body: []byte(`{}`)}}))
	dlq, err := b.DLQ(queue)
	require.NoError(t, err)
	var dead []broker.DeadMessage
	require.Eventually(t, func() bool {
		lctx, lcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer lcancel()
		dead, err = dlq.List(lctx, 0)
		return err == nil && len(dead) == 1
	}, 150*time.Second, 200*time.Millisecond, "the message never reached the DLQ")
	// OnOutcome runs after the settlement, so the DLQ can list the message
	// a moment before the worker reports OutcomeDead.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, o := range outs {
			if o == worker.OutcomeDead {
				return true
			}
		}
		return false
	}, 10*time.Second, 20*time.Millisecond, "the worker never reported OutcomeDead")

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int{1, 2, 3}, attempts, "each redelivery after a lost Retry is the next attempt")
	require.NotContains(t, outs, worker.OutcomeRetry, "no retry happened: every Retry met a closed channel")
	require.Contains(t, dead[0].LastError, "attempt 3")
	logs.mu.Lock()
	require.NotEmpty(t, logs.reasons)
	require.Contains(t, logs.reasons[0], "PRECONDITION_FAILED", "the adapter logs the server's reason")
	logs.mu.Unlock()
}
