package rabbitmq_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/broker/brokertest"
	"github.com/ferrymq/ferry/brokers/rabbitmq"
	"github.com/ferrymq/ferry/internal/testenv"
)

// config is the adapter configuration the tests use: the test server, a
// short reconnect delay.
func config() rabbitmq.Config {
	return rabbitmq.Config{URL: testenv.RabbitMQURL(), ReconnectDelay: 200 * time.Millisecond}
}

func newBroker(t testing.TB) broker.Broker {
	t.Helper()
	testenv.RequireTCP(t, "rabbitmq", testenv.HostPort(testenv.RabbitMQURL()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := rabbitmq.New(ctx, config())
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	return b
}

// deleteTopology removes everything Declare created for tp.
func deleteTopology(ctx context.Context, t testing.TB, tp broker.Topology) {
	conn, err := amqp.Dial(testenv.RabbitMQURL())
	if err != nil {
		t.Logf("delete topology: %v", err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Logf("delete topology: %v", err)
		return
	}
	defer ch.Close()
	for _, q := range tp.Queues {
		for _, n := range rabbitmq.QueueNames(q) {
			if _, err := ch.QueueDelete(n, false, false, false); err != nil {
				t.Logf("delete queue %s: %v", n, err)
				return
			}
		}
	}
	if err := ch.ExchangeDelete(tp.Exchange, false, false); err != nil {
		t.Logf("delete exchange %s: %v", tp.Exchange, err)
	}
}

// removeTopology deletes tp's queues, then its exchange, on a connection
// of its own, as an operator could; it fails when a deletion fails.
func removeTopology(ctx context.Context, t *testing.T, tp broker.Topology) error {
	conn, err := amqp.Dial(testenv.RabbitMQURL())
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	for _, q := range tp.Queues {
		for _, n := range rabbitmq.QueueNames(q) {
			if _, err := ch.QueueDelete(n, false, false, false); err != nil {
				return fmt.Errorf("delete queue %s: %w", n, err)
			}
		}
	}
	if err := ch.ExchangeDelete(tp.Exchange, false, false); err != nil {
		return fmt.Errorf("delete exchange %s: %w", tp.Exchange, err)
	}
	return nil
}

func TestConformance(t *testing.T) { runConformance(t, rabbitmq.QueueTypeClassic) }

// TestConformanceQuorum runs the suite with quorum queues
// (Config.QueueType).
func TestConformanceQuorum(t *testing.T) { runConformance(t, rabbitmq.QueueTypeQuorum) }

func runConformance(t *testing.T, queueType string) {
	addr := testenv.HostPort(testenv.RabbitMQURL())
	testenv.RequireTCP(t, "rabbitmq", addr)
	brokertest.RunConformance(t, brokertest.Harness{
		New: func(ctx context.Context, t *testing.T) (broker.Broker, error) {
			cfg := config()
			cfg.QueueType = queueType
			return rabbitmq.New(ctx, cfg)
		},
		StopServer: func(t *testing.T) {
			testenv.Services(t, "stop", "rabbitmq")
			// The outage must be real: the server the tests talk to is down.
			if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
				c.Close()
				t.Fatalf("services.sh stop rabbitmq left %s reachable: FERRY_RABBITMQ_URL must name the server services.sh runs (eval \"$(compose/local/services.sh env)\")", addr)
			}
		},
		StartServer: func(t *testing.T) {
			testenv.Services(t, "start", "rabbitmq")
			testenv.RequireTCP(t, "rabbitmq", addr)
		},
		DeleteTopology: func(ctx context.Context, t *testing.T, tp broker.Topology) { deleteTopology(ctx, t, tp) },
		RemoveTopology: removeTopology,
		// RabbitMQ reads "CC" and "BCC" as sender-selected destinations and
		// closes the channel with PRECONDITION_FAILED when one is a string.
		Poison: func(ctx context.Context, t *testing.T, b broker.Broker, tp broker.Topology, id, typ string) *broker.Message {
			return &broker.Message{ID: id, Type: typ, Body: []byte("poison"), Headers: map[string]string{"CC": "not-an-array"}}
		},
	})
}

func topology(t *testing.T, delays ...time.Duration) broker.Topology {
	base := testenv.UniqueName("rmq")
	tp := broker.Topology{Exchange: base + ".ex", Queues: []broker.Queue{{
		Name: base + ".work", Bindings: []string{"order.*", "invoice.#"}, RetryDelays: delays,
	}}}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		deleteTopology(ctx, t, tp)
	})
	return tp
}

// mgmt GETs path from the management HTTP API into v.
func mgmt(t *testing.T, path string, v any) int {
	t.Helper()
	base, err := url.Parse(testenv.RabbitMQManagementURL())
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodGet, strings.TrimSuffix(base.Scheme+"://"+base.Host, "/")+path, nil)
	require.NoError(t, err)
	if base.User != nil {
		pw, _ := base.User.Password()
		req.SetBasicAuth(base.User.Username(), pw)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err, "management API at %s", base.Host)
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK && v != nil {
		require.NoError(t, json.NewDecoder(resp.Body).Decode(v))
	}
	return resp.StatusCode
}

type mgmtQueue struct {
	Name       string         `json:"name"`
	Durable    bool           `json:"durable"`
	AutoDelete bool           `json:"auto_delete"`
	Arguments  map[string]any `json:"arguments"`
}

// TestTopologyInManagementAPI checks what Declare leaves on the server, as
// the management plugin shows it.
func TestTopologyInManagementAPI(t *testing.T) {
	b := newBroker(t)
	tp := topology(t, 200*time.Millisecond, 1500*time.Millisecond, 2*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, b.Declare(ctx, tp))
	work := tp.Queues[0].Name

	var ex struct {
		Type       string `json:"type"`
		Durable    bool   `json:"durable"`
		AutoDelete bool   `json:"auto_delete"`
	}
	require.Equal(t, http.StatusOK, mgmt(t, "/api/exchanges/%2F/"+url.PathEscape(tp.Exchange), &ex))
	require.Equal(t, "topic", ex.Type)
	require.True(t, ex.Durable)
	require.False(t, ex.AutoDelete)

	var wq mgmtQueue
	require.Equal(t, http.StatusOK, mgmt(t, "/api/queues/%2F/"+url.PathEscape(work), &wq))
	require.True(t, wq.Durable)
	require.False(t, wq.AutoDelete)

	var dlq mgmtQueue
	require.Equal(t, http.StatusOK, mgmt(t, "/api/queues/%2F/"+url.PathEscape(work+".dlq"), &dlq))
	require.True(t, dlq.Durable, "the DLQ is durable")

	for i, ttl := range []float64{200, 1500, 120000} {
		var rq mgmtQueue
		name := fmt.Sprintf("%s.retry.%d", work, i)
		require.Equal(t, http.StatusOK, mgmt(t, "/api/queues/%2F/"+url.PathEscape(name), &rq), name)
		require.True(t, rq.Durable, name)
		require.Equal(t, ttl, rq.Arguments["x-message-ttl"], "%s x-message-ttl", name)
		require.Equal(t, "", rq.Arguments["x-dead-letter-exchange"], "%s dead-letters through the default exchange", name)
		require.Equal(t, work, rq.Arguments["x-dead-letter-routing-key"], "%s returns to its work queue only", name)
	}
	require.Equal(t, http.StatusNotFound, mgmt(t, "/api/queues/%2F/"+url.PathEscape(work+".retry.3"), nil))

	var binds []struct {
		RoutingKey string `json:"routing_key"`
	}
	require.Equal(t, http.StatusOK, mgmt(t, "/api/bindings/%2F/e/"+url.PathEscape(tp.Exchange)+"/q/"+url.PathEscape(work), &binds))
	var keys []string
	for _, bd := range binds {
		keys = append(keys, bd.RoutingKey)
	}
	require.ElementsMatch(t, []string{"order.*", "invoice.#"}, keys)

	// Nothing but the work queue is bound to the exchange: retries and dead
	// letters never pass through it.
	var all []struct {
		Destination string `json:"destination"`
	}
	require.Equal(t, http.StatusOK, mgmt(t, "/api/exchanges/%2F/"+url.PathEscape(tp.Exchange)+"/bindings/source", &all))
	for _, bd := range all {
		require.Equal(t, work, bd.Destination)
	}
}

// TestDefaultRetryDelay: a queue without RetryDelays gets one 30s level.
func TestDefaultRetryDelay(t *testing.T) {
	b := newBroker(t)
	tp := topology(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, b.Declare(ctx, tp))
	var rq mgmtQueue
	require.Equal(t, http.StatusOK, mgmt(t, "/api/queues/%2F/"+url.PathEscape(tp.Queues[0].Name+".retry.0"), &rq))
	require.Equal(t, float64(30000), rq.Arguments["x-message-ttl"])
}

// TestQuorumQueueArguments checks what Declare sets on quorum queues, as
// the management plugin shows it: every queue is a quorum queue with a
// delivery limit no redelivery storm reaches (RabbitMQ 4.x would drop a
// message after 20 returns by default), and retry levels dead-letter at
// least once.
func TestQuorumQueueArguments(t *testing.T) {
	cfg := config()
	cfg.QueueType = rabbitmq.QueueTypeQuorum
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := rabbitmq.New(ctx, cfg)
	require.NoError(t, err)
	defer b.Close()
	tp := topology(t, 200*time.Millisecond)
	require.NoError(t, b.Declare(ctx, tp))
	for _, name := range rabbitmq.QueueNames(tp.Queues[0]) {
		var q mgmtQueue
		require.Equal(t, http.StatusOK, mgmt(t, "/api/queues/%2F/"+url.PathEscape(name), &q), name)
		require.Equal(t, "quorum", q.Arguments["x-queue-type"], name)
		require.Equal(t, float64(rabbitmq.QuorumDeliveryLimit), q.Arguments["x-delivery-limit"], name)
		if strings.Contains(name, ".retry.") {
			require.Equal(t, "at-least-once", q.Arguments["x-dead-letter-strategy"], name)
			require.Equal(t, "reject-publish", q.Arguments["x-overflow"], name)
		}
		require.NotContains(t, q.Arguments, "x-max-length", name)
	}
	// A message retried through a quorum retry level comes back.
	sub, err := b.Subscribe(ctx, tp.Queues[0].Name, broker.SubscribeOptions{})
	require.NoError(t, err)
	defer sub.Close()
	require.NoError(t, b.Publish(ctx, []*broker.Message{{ID: "q1", Type: "order.created", Body: []byte("{}")}}))
	d, err := sub.Receive(ctx)
	require.NoError(t, err)
	require.NoError(t, d.Retry(ctx, 0, "again"))
	d, err = sub.Receive(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, d.Message().Attempt)
	require.NoError(t, d.Ack(ctx))
}

// TestQueueTypeMismatch: declaring queues that exist with the other type
// is a permanent refusal that says how to fix it, both ways.
func TestQueueTypeMismatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []struct{ first, second string }{
		{rabbitmq.QueueTypeClassic, rabbitmq.QueueTypeQuorum},
		{rabbitmq.QueueTypeQuorum, rabbitmq.QueueTypeClassic},
	} {
		tp := topology(t, time.Second)
		cfg := config()
		cfg.QueueType = c.first
		b1, err := rabbitmq.New(ctx, cfg)
		require.NoError(t, err)
		require.NoError(t, b1.Declare(ctx, tp))
		b1.Close()
		cfg.QueueType = c.second
		b2, err := rabbitmq.New(ctx, cfg)
		require.NoError(t, err)
		err = b2.Declare(ctx, tp)
		b2.Close()
		require.ErrorIs(t, err, broker.ErrTopologyMismatch, "%s then %s", c.first, c.second)
		require.Contains(t, err.Error(), "--rabbitmq-queue-type "+c.first, "says which setting matches the queue")
		require.Contains(t, err.Error(), "x-queue-type")
	}
}

// TestQueueTypeInvalid: an unknown queue type is refused by New.
func TestQueueTypeInvalid(t *testing.T) {
	cfg := config()
	cfg.QueueType = "stream"
	_, err := rabbitmq.New(context.Background(), cfg)
	require.ErrorContains(t, err, "Config.QueueType")
}

// TestDeclareChangedRetryDelayRefused: RabbitMQ refuses to redeclare a
// retry level with another TTL; the error names the queue.
func TestDeclareChangedRetryDelayRefused(t *testing.T) {
	b := newBroker(t)
	tp := topology(t, 200*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, b.Declare(ctx, tp))
	changed := tp
	changed.Queues = []broker.Queue{tp.Queues[0]}
	changed.Queues[0].RetryDelays = []time.Duration{300 * time.Millisecond}
	err := newBroker(t).Declare(ctx, changed)
	require.Error(t, err)
	require.Contains(t, err.Error(), tp.Queues[0].Name+".retry.0")
	require.Contains(t, err.Error(), "PRECONDITION_FAILED")
	require.ErrorIs(t, err, broker.ErrTopologyMismatch, "a permanent refusal, not worth retrying")
	require.Contains(t, err.Error(), "x-message-ttl", "names the argument that differs")
	require.Contains(t, err.Error(), "same retry delays", "says how to fix it")
	// The adapter that declared first still works.
	require.NoError(t, b.Declare(ctx, tp))
	// Another exchange on the same adapter is refused.
	other := topology(t, time.Second)
	require.ErrorContains(t, b.Declare(ctx, other), "already publishes to exchange")
}

// TestWireFormat reads a published message raw: persistent, message-id,
// type, string headers, the key in x-ferry-key.
func TestWireFormat(t *testing.T) {
	b := newBroker(t)
	tp := topology(t, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, b.Declare(ctx, tp))
	require.NoError(t, b.Publish(ctx, []*broker.Message{{ID: "42", Type: "order.created", Key: "user-7",
		Body: []byte(`{"a":1}`), Headers: map[string]string{"h": "v"}}}))

	conn, err := amqp.Dial(testenv.RabbitMQURL())
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	d, ok, err := ch.Get(tp.Queues[0].Name, true)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, uint8(amqp.Persistent), d.DeliveryMode)
	require.Equal(t, "42", d.MessageId)
	require.Equal(t, "order.created", d.Type)
	require.Equal(t, "order.created", d.RoutingKey)
	require.Equal(t, tp.Exchange, d.Exchange)
	require.Equal(t, "v", d.Headers["h"])
	require.Equal(t, "user-7", d.Headers["x-ferry-key"])
	require.NotContains(t, d.Headers, broker.HeaderRetryCount)
	require.Equal(t, `{"a":1}`, string(d.Body))
}

// TestXDeathIgnored: a message that already carries an x-death header (it
// went through a retry queue) still counts attempts from x-retry-count only.
func TestXDeathIgnored(t *testing.T) {
	b := newBroker(t)
	tp := topology(t, 100*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, b.Declare(ctx, tp))
	sub, err := b.Subscribe(ctx, tp.Queues[0].Name, broker.SubscribeOptions{})
	require.NoError(t, err)
	require.NoError(t, b.Publish(ctx, []*broker.Message{{ID: "x", Type: "order.created"}}))
	for attempt := 1; attempt <= 3; attempt++ {
		d, err := sub.Receive(ctx)
		require.NoError(t, err)
		require.Equal(t, attempt, d.Message().Attempt)
		require.NotContains(t, d.Message().Headers, "x-death")
		if attempt < 3 {
			require.NoError(t, d.Retry(ctx, 0, "again"))
		} else {
			require.NoError(t, d.Ack(ctx))
		}
	}
}

// TestReconnectAfterServerClosesConnections: the server force-closes every
// connection (as an operator or a failover does); publisher and
// subscription reconnect by themselves and nothing confirmed is lost.
func TestReconnectAfterServerClosesConnections(t *testing.T) {
	testenv.RequireTCP(t, "rabbitmq", testenv.HostPort(testenv.RabbitMQURL()))
	cfg := config()
	cfg.ConnectionName = testenv.UniqueName("ferry-reconnect")
	logs := &lockedBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	b, err := rabbitmq.New(context.Background(), cfg)
	require.NoError(t, err)
	defer b.Close()
	tp := topology(t, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	require.NoError(t, b.Declare(ctx, tp))
	sub, err := b.Subscribe(ctx, tp.Queues[0].Name, broker.SubscribeOptions{Prefetch: 5})
	require.NoError(t, err)
	require.NoError(t, b.Publish(ctx, []*broker.Message{{ID: "before", Type: "order.created"}}))
	held, err := sub.Receive(ctx)
	require.NoError(t, err)
	require.Equal(t, "before", held.Message().ID)

	// Close every ferry connection through the management API.
	var conns []struct {
		Name       string         `json:"name"`
		ClientProp map[string]any `json:"client_properties"`
	}
	// The management API lists a connection once its first statistics
	// event arrived (every 5s by default).
	ours := func() []string {
		var names []string
		require.Equal(t, http.StatusOK, mgmt(t, "/api/connections", &conns))
		for _, c := range conns {
			if name, _ := c.ClientProp["connection_name"].(string); strings.HasPrefix(name, cfg.ConnectionName+"-") {
				names = append(names, c.Name)
			}
		}
		return names
	}
	require.Eventually(t, func() bool { return len(ours()) >= 2 }, 15*time.Second, 200*time.Millisecond,
		"the adapter's two connections never showed in the management API")
	closed := 0
	base, _ := url.Parse(testenv.RabbitMQManagementURL())
	pw, _ := base.User.Password()
	for _, name := range ours() {
		c := struct{ Name string }{name}
		req, _ := http.NewRequest(http.MethodDelete, base.Scheme+"://"+base.Host+"/api/connections/"+url.PathEscape(c.Name), nil)
		req.SetBasicAuth(base.User.Username(), pw)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		closed++
	}
	require.Positive(t, closed, "no ferry connection found in the management API")

	// The held delivery's channel is gone: settling it fails, classified
	// as a lost connection (ferry_worker_settle_failures_total's reason),
	// and the message comes back.
	var ackErr error
	require.Eventually(t, func() bool { ackErr = held.Ack(ctx); return ackErr != nil }, 5*time.Second, 50*time.Millisecond)
	require.Equal(t, broker.ReasonConnection, broker.SettleReason(ackErr), "%v", ackErr)
	require.NoError(t, b.Publish(ctx, []*broker.Message{{ID: "after", Type: "order.created"}}))
	seen := map[string]bool{}
	for !seen["before"] || !seen["after"] {
		d, err := sub.Receive(ctx)
		require.NoError(t, err)
		seen[d.Message().ID] = true
		require.NoError(t, d.Ack(ctx))
	}
	// Each "connection lost" is followed by a "reconnected" for the same
	// connection, also when the first dial after the loss succeeds.
	for _, role := range []string{"publish", "consume"} {
		var lines []string
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "connection="+role) && (strings.Contains(l, "connection lost") || strings.Contains(l, "reconnected")) {
				lines = append(lines, l)
			}
		}
		require.NotEmpty(t, lines, "no connection lost line for the %s connection:\n%s", role, logs.String())
		require.Contains(t, lines[0], "connection lost", role)
		require.Contains(t, lines[len(lines)-1], "rabbitmq: reconnected", "the %s connection's loss is followed by reconnected:\n%s", role, strings.Join(lines, "\n"))
	}
}

// lockedBuffer is a bytes.Buffer safe for concurrent writes (a logger's
// handler writes from the adapter's goroutines).
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestNewUnreachable: New fails within its ctx when nothing listens, and
// the error names the URL without the password.
func TestNewUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = rabbitmq.New(ctx, rabbitmq.Config{URL: "amqp://guest:secret@" + addr + "/", ReconnectDelay: 100 * time.Millisecond})
	require.Error(t, err)
	require.Less(t, time.Since(start), 4*time.Second)
	require.Contains(t, err.Error(), addr)
	require.NotContains(t, err.Error(), "secret")
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestConfigValidation(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range []rabbitmq.Config{
		{URL: "http://nope"},
		{PublishTimeout: -time.Second},
		{PublishChannels: -1},
		{MaxHeaderBytes: 1 << 20},
	} {
		_, err := rabbitmq.New(ctx, cfg)
		require.Error(t, err, "%+v", cfg)
		require.True(t, strings.HasPrefix(err.Error(), "rabbitmq: Config."), err.Error())
	}
}

// TestPublishInvalidMessages: bad input is reported per message, never sent.
func TestPublishInvalidMessages(t *testing.T) {
	b := newBroker(t)
	tp := topology(t, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, b.Publish(ctx, nil))
	err := b.Publish(ctx, []*broker.Message{{ID: "1", Type: "order.created"}})
	require.ErrorContains(t, err, "Declare first")
	require.NoError(t, b.Declare(ctx, tp))
	batch := []*broker.Message{
		{ID: "", Type: "order.created"},
		{ID: "ok", Type: "order.created"},
		nil,
		{ID: "2", Type: ""},
		{ID: strings.Repeat("9", 256), Type: "order.created"},
		{ID: "3", Type: "order.created", Headers: map[string]string{"x-ferry-key": "mine"}},
	}
	err = b.Publish(ctx, batch)
	failed := broker.FailedIndexes(err, len(batch))
	require.Len(t, failed, 5, "%v", err)
	require.NotContains(t, failed, 1)
}

// TestManyUnroutable: more returns than the returns buffer holds, in one
// batch, interleaved with routable messages; each is reported by index.
func TestManyUnroutable(t *testing.T) {
	b := newBroker(t)
	tp := topology(t, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	require.NoError(t, b.Declare(ctx, tp))
	var batch []*broker.Message
	for i := 0; i < 1500; i++ {
		typ := "nobody.listens"
		if i%3 == 0 {
			typ = "order.created"
		}
		batch = append(batch, &broker.Message{ID: fmt.Sprint(i % 7), Type: typ, Body: make([]byte, 100)})
	}
	err := b.Publish(ctx, batch)
	failed := broker.FailedIndexes(err, len(batch))
	require.Len(t, failed, 1000)
	for i := range batch {
		if i%3 == 0 {
			require.NotContains(t, failed, i)
		} else {
			require.ErrorIs(t, failed[i], broker.ErrUnroutable, "index %d", i)
		}
	}
	// The adapter's channels are still fine.
	require.NoError(t, b.Publish(ctx, []*broker.Message{{ID: "ok", Type: "order.created"}}))
}

// TestResumesAfterQueueRecreated: an operator deletes the work queue under
// a consumer (the server cancels it); once the queue is declared again the
// subscription consumes again by itself.
func TestResumesAfterQueueRecreated(t *testing.T) {
	b := newBroker(t)
	tp := topology(t, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	require.NoError(t, b.Declare(ctx, tp))
	sub, err := b.Subscribe(ctx, tp.Queues[0].Name, broker.SubscribeOptions{})
	require.NoError(t, err)

	conn, err := amqp.Dial(testenv.RabbitMQURL())
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDelete(tp.Queues[0].Name, false, false, false)
	require.NoError(t, err)
	time.Sleep(500 * time.Millisecond)

	require.NoError(t, newBroker(t).Declare(ctx, tp)) // another process starts
	require.NoError(t, b.Publish(ctx, []*broker.Message{{ID: "again", Type: "order.created"}}))
	d, err := sub.Receive(ctx)
	require.NoError(t, err)
	require.Equal(t, "again", d.Message().ID)
	require.NoError(t, d.Ack(ctx))
}

// TestDLQLookupCreatesNothing: the DLQ operations of a broker that never
// declared look queues up passively: for a queue that does not exist,
// nothing appears on the server (no queue, DLQ or retry level); a DLQ
// whose work queue is gone can still be listed, but not replayed.
func TestDLQLookupCreatesNothing(t *testing.T) {
	b := newBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := testenv.UniqueName("rmq") + ".nowhere"
	dlq, err := b.DLQ(name)
	require.NoError(t, err)
	_, err = dlq.List(ctx, 0)
	require.ErrorIs(t, err, broker.ErrUnknownQueue)
	require.ErrorContains(t, err, name)
	_, err = dlq.Replay(ctx, nil)
	require.ErrorIs(t, err, broker.ErrUnknownQueue)
	_, err = dlq.Purge(ctx, []string{"1"})
	require.ErrorIs(t, err, broker.ErrUnknownQueue)
	for _, n := range []string{name, name + ".dlq", name + ".retry.0"} {
		require.Equal(t, http.StatusNotFound, mgmt(t, "/api/queues/%2F/"+url.PathEscape(n), nil), "queue %s must not exist", n)
	}
	// The broker still works after the 404s closed the lookup channels.
	tp := topology(t, time.Second)
	require.NoError(t, b.Declare(ctx, tp))

	// Only the DLQ left: List works, Replay is refused before it takes
	// anything out of the DLQ.
	only := testenv.UniqueName("rmq") + ".orphan"
	conn, err := amqp.Dial(testenv.RabbitMQURL())
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	_, err = ch.QueueDeclare(only+".dlq", true, false, false, false, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = ch.QueueDelete(only+".dlq", false, false, false) })
	require.NoError(t, ch.PublishWithContext(ctx, "", only+".dlq", false, false, amqp.Publishing{MessageId: "7", Type: "evt.x", Body: []byte("b")}))
	orphan, err := newBroker(t).DLQ(only)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		list, err := orphan.List(ctx, 0)
		return err == nil && len(list) == 1 && list[0].Message.ID == "7"
	}, 5*time.Second, 50*time.Millisecond)
	_, err = orphan.Replay(ctx, nil)
	require.ErrorIs(t, err, broker.ErrUnknownQueue)
	require.ErrorContains(t, err, "work queue")
	list, err := orphan.List(ctx, 0)
	require.NoError(t, err)
	require.Len(t, list, 1, "a refused replay leaves the DLQ as it was")
}
