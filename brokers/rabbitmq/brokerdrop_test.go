package rabbitmq_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/rabbitmq"
	"github.com/ferrymq/ferry/internal/testenv"
)

// mgmtDo sends method path with the JSON body to the management HTTP API
// and returns the status code.
func mgmtDo(t *testing.T, method, path string, body any) int {
	t.Helper()
	base, err := url.Parse(testenv.RabbitMQManagementURL())
	require.NoError(t, err)
	var rd *bytes.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, err := http.NewRequest(method, base.Scheme+"://"+base.Host+path, rd)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if base.User != nil {
		pw, _ := base.User.Password()
		req.SetBasicAuth(base.User.Username(), pw)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err, "management API at %s", base.Host)
	resp.Body.Close()
	return resp.StatusCode
}

// setPolicy sets an operator's policy on the one queue named queue (the
// pattern matches that name only, so no other engineer's or test's queue
// is touched) and removes it when the test ends.
func setPolicy(t *testing.T, queue string, definition map[string]any) {
	t.Helper()
	name := "ferry-test-" + queue
	path := "/api/policies/%2F/" + url.PathEscape(name)
	code := mgmtDo(t, http.MethodPut, path, map[string]any{
		"pattern": "^" + strings.ReplaceAll(queue, ".", `\.`) + "$", "definition": definition,
		"apply-to": "queues", "priority": 100,
	})
	require.Contains(t, []int{http.StatusCreated, http.StatusNoContent}, code, "set policy %s", name)
	t.Cleanup(func() { mgmtDo(t, http.MethodDelete, path, nil) })
}

// TestBrokerDropsReachTheDLQ: an operator's policy with max-length and
// message-ttl on a work queue makes RabbitMQ drop messages by itself; each
// lands in the queue's DLQ and `ferry dlq list` (DeadLetterQueue.List)
// shows it with RabbitMQ's reason (x-death) as LastError. Before the work
// queues had a dead-letter exchange, the dropped messages vanished: 0 in
// the queue, 0 in the DLQ.
func TestBrokerDropsReachTheDLQ(t *testing.T) {
	for _, qt := range []string{rabbitmq.QueueTypeClassic, rabbitmq.QueueTypeQuorum} {
		t.Run(qt, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cfg := config()
			cfg.QueueType = qt
			b, err := rabbitmq.New(ctx, cfg)
			require.NoError(t, err)
			defer b.Close()
			tp := topology(t, time.Second)
			work := tp.Queues[0].Name
			require.NoError(t, b.Declare(ctx, tp))
			setPolicy(t, work, map[string]any{"max-length": 2, "message-ttl": 1500})
			time.Sleep(500 * time.Millisecond) // the policy reaches the queue

			var msgs []*broker.Message
			for i := range 3 {
				msgs = append(msgs, &broker.Message{ID: fmt.Sprintf("m%d", i), Type: "order.created", Body: []byte("{}")})
			}
			require.NoError(t, b.Publish(ctx, msgs))
			// m0 is dropped at once (max-length 2, drop-head); m1 and m2
			// expire after 1.5 s with nobody consuming.
			dq, err := b.DLQ(work)
			require.NoError(t, err)
			var dead []broker.DeadMessage
			require.Eventually(t, func() bool {
				dead, err = dq.List(ctx, 0)
				require.NoError(t, err)
				return len(dead) == 3
			}, 20*time.Second, 200*time.Millisecond, "the dropped messages never reached the DLQ")
			reasons := map[string]string{}
			for _, d := range dead {
				reasons[d.Message.ID] = d.LastError
				require.False(t, d.DeadAt.IsZero(), "%s: DeadAt from x-death", d.Message.ID)
				require.Empty(t, d.Message.Headers["x-death"], "x-death is not passed on as a ferry header")
				t.Logf("%s: %s", d.Message.ID, d.LastError)
			}
			require.Contains(t, reasons["m0"], `x-death reason "maxlen"`)
			require.Contains(t, reasons["m0"], work)
			require.Contains(t, reasons["m1"], `x-death reason "expired"`)
			require.Contains(t, reasons["m2"], `x-death reason "expired"`)

			// Replayed, the message goes back to the work queue without
			// the death headers, and a worker sees a first attempt.
			mgmtDo(t, http.MethodDelete, "/api/policies/%2F/"+url.PathEscape("ferry-test-"+work), nil)
			time.Sleep(500 * time.Millisecond)
			ids, err := dq.Replay(ctx, []string{"m0"})
			require.NoError(t, err)
			require.Equal(t, []string{"m0"}, ids)
			sub, err := b.Subscribe(ctx, work, broker.SubscribeOptions{})
			require.NoError(t, err)
			defer sub.Close()
			d, err := sub.Receive(ctx)
			require.NoError(t, err)
			require.Equal(t, "m0", d.Message().ID)
			require.Equal(t, 1, d.Message().Attempt)
			require.NoError(t, d.Ack(ctx))
		})
	}
}

// TestUpgradeKeepsWorkQueueWithoutDLX: a work queue declared by a ferry
// before work queues had a dead-letter exchange (so without
// x-dead-letter-exchange) is still accepted by Declare (a queue's
// arguments cannot change in place; refusing it would stop the upgrade),
// with a warning that gives the policy adding it; with that policy set,
// RabbitMQ's drops reach the DLQ too.
func TestUpgradeKeepsWorkQueueWithoutDLX(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tp := topology(t, time.Second)
	work := tp.Queues[0].Name

	// The queue as an older ferry declared it.
	conn, err := amqp.Dial(testenv.RabbitMQURL())
	require.NoError(t, err)
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(work, true, false, false, false, amqp.Table{"x-queue-type": "classic"})
	require.NoError(t, err)
	conn.Close()

	logs := &lockedBuffer{}
	cfg := config()
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	b, err := rabbitmq.New(ctx, cfg)
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.Declare(ctx, tp), "an existing work queue without a dead-letter exchange is kept")
	require.Contains(t, logs.String(), "work queue has no dead-letter exchange")
	require.Contains(t, logs.String(), "set_policy")

	// The policy the warning gives, as an operator's policy with a limit.
	setPolicy(t, work, map[string]any{"max-length": 1, "dead-letter-exchange": "", "dead-letter-routing-key": broker.DLQName(work)})
	time.Sleep(500 * time.Millisecond)
	require.NoError(t, b.Publish(ctx, []*broker.Message{
		{ID: "old", Type: "order.created", Body: []byte("{}")}, {ID: "new", Type: "order.created", Body: []byte("{}")},
	}))
	dq, err := b.DLQ(work)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		dead, err := dq.List(ctx, 0)
		require.NoError(t, err)
		return len(dead) == 1 && dead[0].Message.ID == "old" && strings.Contains(dead[0].LastError, "maxlen")
	}, 10*time.Second, 200*time.Millisecond)
	require.Contains(t, rabbitmq.PolicyDLX(work), `"dead-letter-routing-key":"`+broker.DLQName(work)+`"`)
}

// TestWorkQueueDeadLettersToDLQ checks the arguments Declare gives a new
// work queue, as the management API shows them.
func TestWorkQueueDeadLettersToDLQ(t *testing.T) {
	b := newBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tp := topology(t)
	require.NoError(t, b.Declare(ctx, tp))
	var q mgmtQueue
	require.Equal(t, http.StatusOK, mgmt(t, "/api/queues/%2F/"+url.PathEscape(tp.Queues[0].Name), &q))
	require.Equal(t, "", q.Arguments["x-dead-letter-exchange"])
	require.Equal(t, broker.DLQName(tp.Queues[0].Name), q.Arguments["x-dead-letter-routing-key"])
	var dlq mgmtQueue
	require.Equal(t, http.StatusOK, mgmt(t, "/api/queues/%2F/"+url.PathEscape(broker.DLQName(tp.Queues[0].Name)), &dlq))
	require.NotContains(t, dlq.Arguments, "x-dead-letter-exchange", "the DLQ dead-letters nowhere")
}
