package ferrycli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/nats"
	"github.com/ferrymq/ferry/brokers/rabbitmq"
	"github.com/ferrymq/ferry/brokers/sqs"
	"github.com/ferrymq/ferry/internal/testenv"
)

// deadLetters declares tp on b (as a worker would) and dead-letters one
// message per id from its first queue, each with the application id
// "app-"+id (broker.HeaderAppID).
func deadLetters(t *testing.T, b broker.Broker, tp broker.Topology, ids ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, b.Declare(ctx, tp))
	sub, err := b.Subscribe(ctx, tp.Queues[0].Name, broker.SubscribeOptions{})
	require.NoError(t, err)
	defer sub.Close()
	for _, id := range ids {
		require.NoError(t, b.Publish(ctx, []*broker.Message{{ID: id, Type: "notification.requested", Body: []byte(`{}`),
			Headers: map[string]string{broker.HeaderAppID: "app-" + id}}}))
		d, err := sub.Receive(ctx)
		require.NoError(t, err)
		require.Equal(t, id, d.Message().ID)
		require.NoError(t, d.DeadLetter(ctx, "smtp down"))
	}
}

func rabbitBroker(t *testing.T) broker.Broker {
	t.Helper()
	testenv.RequireTCP(t, "rabbitmq", testenv.HostPort(testenv.RabbitMQURL()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := rabbitmq.New(ctx, rabbitmq.Config{URL: testenv.RabbitMQURL()})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	return b
}

// rabbitQueues are the queues Declare makes for queue with one retry level.
func rabbitQueues(queue string) []string {
	return []string{queue, queue + ".dlq", queue + ".retry.0"}
}

// deleteRabbit removes queues and the exchange, for cleanup.
func deleteRabbit(t *testing.T, exchange string, queues ...string) {
	conn, err := amqp.Dial(testenv.RabbitMQURL())
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	defer ch.Close()
	for _, q := range queues {
		_, _ = ch.QueueDelete(q, false, false, false)
	}
	if exchange != "" {
		_ = ch.ExchangeDelete(exchange, false, false)
	}
}

// rabbitQueueExists asks the management API.
func rabbitQueueExists(t *testing.T, name string) bool {
	t.Helper()
	base, err := url.Parse(testenv.RabbitMQManagementURL())
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodGet, base.Scheme+"://"+base.Host+"/api/queues/%2F/"+url.PathEscape(name), nil)
	require.NoError(t, err)
	if base.User != nil {
		pw, _ := base.User.Password()
		req.SetBasicAuth(base.User.Username(), pw)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Contains(t, []int{http.StatusOK, http.StatusNotFound}, resp.StatusCode)
	return resp.StatusCode == http.StatusOK
}

func rabbitArgs(queue string, more ...string) []string {
	return append([]string{"--broker", "rabbitmq", "--rabbitmq-url", testenv.RabbitMQURL(), "--queue", queue}, more...)
}

// TestDLQUnknownQueueRabbitMQ: a --queue RabbitMQ does not have is an
// error naming the queue and its DLQ, exit 1, and nothing is created (the
// dlq commands used to declare the queue, its DLQ and a retry level).
func TestDLQUnknownQueueRabbitMQ(t *testing.T) {
	q := testenv.UniqueName("cli-dlq") + ".nowhere"
	t.Cleanup(func() { deleteRabbit(t, "", rabbitQueues(q)...) })
	for _, args := range [][]string{
		{"dlq", "list"},
		{"dlq", "replay", "--all"},
		{"dlq", "replay", "--id", "1", "--dry-run"},
		{"dlq", "purge", "--all", "--yes"},
	} {
		code, out, errOut := run(t, append(args, rabbitArgs(q)...)...)
		require.Equal(t, 1, code, "%v: stdout %q stderr %q", args, out, errOut)
		require.Contains(t, errOut, fmt.Sprintf("ferry: %s: no queue %q on rabbitmq", strings.Join(args[:2], " "), q))
		require.Contains(t, errOut, "--queue")
		require.Contains(t, errOut, q+".dlq\"")
		require.NotContains(t, out, "dead message(s)", "no false empty list")
	}
	for _, name := range rabbitQueues(q) {
		require.False(t, rabbitQueueExists(t, name), "ferry dlq must not create %s", name)
	}
}

// TestDLQDeclaresNothingRabbitMQ: the dlq commands work on a queue
// declared with a retry delay they are not told (they declare nothing, so
// no PRECONDITION_FAILED, and take no --retry-delay), and replay or purge
// of an ID not in the DLQ exits 1 after acting on the IDs that were.
func TestDLQDeclaresNothingRabbitMQ(t *testing.T) {
	base := testenv.UniqueName("cli-dlq")
	tp := broker.Topology{Exchange: base + ".ex", Queues: []broker.Queue{{
		Name: base + ".work", Bindings: []string{"notification.requested"}, RetryDelays: []time.Duration{30 * time.Second},
	}}}
	q := tp.Queues[0].Name
	t.Cleanup(func() { deleteRabbit(t, tp.Exchange, rabbitQueues(q)...) })
	deadLetters(t, rabbitBroker(t), tp, "m1", "m2", "m3")

	code, out, errOut := run(t, append([]string{"dlq", "list"}, rabbitArgs(q)...)...)
	require.Equal(t, 0, code, "stderr: %s", errOut)
	require.Contains(t, out, "3 dead message(s)")
	require.NotContains(t, errOut, "PRECONDITION_FAILED")

	code, out, errOut = run(t, append([]string{"dlq", "replay", "--id", "m1", "--id", "999"}, rabbitArgs(q)...)...)
	require.Equal(t, 1, code, "an ID not in the DLQ is an error; stdout %q", out)
	require.Empty(t, out, "a failing command prints no result line")
	require.Contains(t, errOut, "ferry: dlq replay: 1 of 2 requested ID(s) not in the DLQ "+q+`.dlq (RabbitMQ queue "`+q+`.dlq"): 999; the other 1 replayed to `+q+": m1")

	code, out, errOut = run(t, append([]string{"dlq", "replay", "--id", "998", "--dry-run"}, rabbitArgs(q)...)...)
	require.Equal(t, 1, code, "stdout %q", out)
	require.Contains(t, errOut, "998")

	code, _, errOut = run(t, append([]string{"dlq", "purge", "--id", "m2,997", "--yes"}, rabbitArgs(q)...)...)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "ferry: dlq purge: 1 of 2 requested ID(s) not in the DLQ "+q+`.dlq (RabbitMQ queue "`+q+`.dlq"): 997`)

	code, out, errOut = run(t, append([]string{"dlq", "list", "--format", "json"}, rabbitArgs(q)...)...)
	require.Equal(t, 0, code, "stderr: %s", errOut)
	require.Contains(t, out, `"id": "m3"`)
	require.NotContains(t, out, `"id": "m1"`, "replayed")
	require.NotContains(t, out, `"id": "m2"`, "purged")

	code, out, errOut = run(t, append([]string{"dlq", "purge", "--all", "--yes"}, rabbitArgs(q)...)...)
	require.Equal(t, 0, code, "stderr: %s", errOut)
	require.Contains(t, out, "purged 1 message(s)")
}

// TestDLQListSaysTotalAndAppID: a list cut by --limit says how many dead
// messages there are in all and how to see the rest; the application id
// (x-app-id, the notification id in the sample app) is shown, in JSON too,
// and --app-id finds a message by it.
func TestDLQListSaysTotalAndAppID(t *testing.T) {
	base := testenv.UniqueName("cli-dlq")
	tp := broker.Topology{Exchange: base + ".ex", Queues: []broker.Queue{{
		Name: base + ".work", Bindings: []string{"notification.requested"}, RetryDelays: []time.Duration{30 * time.Second},
	}}}
	q := tp.Queues[0].Name
	t.Cleanup(func() { deleteRabbit(t, tp.Exchange, rabbitQueues(q)...) })
	deadLetters(t, rabbitBroker(t), tp, "m1", "m2", "m3", "m4", "m5")

	code, out, errOut := run(t, append([]string{"dlq", "list", "--limit", "2"}, rabbitArgs(q)...)...)
	require.Equal(t, 0, code, "stderr: %s", errOut)
	require.Contains(t, out, "APP ID")
	require.Contains(t, out, "app-m1")
	require.NotContains(t, out, "app-m3", "cut at 2")
	require.Contains(t, out, "showing the oldest 2 of 5 dead message(s) in the DLQ "+q+`.dlq (RabbitMQ queue "`+q+`.dlq"); --limit 0 lists all`)

	code, out, errOut = run(t, append([]string{"dlq", "list"}, rabbitArgs(q)...)...)
	require.Equal(t, 0, code, "stderr: %s", errOut)
	require.Contains(t, out, "5 dead message(s) in the DLQ")
	require.NotContains(t, out, "showing")

	code, out, errOut = run(t, append([]string{"dlq", "list", "--app-id", "app-m4"}, rabbitArgs(q)...)...)
	require.Equal(t, 0, code, "stderr: %s", errOut)
	require.Contains(t, out, "m4")
	require.NotContains(t, out, "app-m1")
	require.Contains(t, out, "1 matching dead message(s) (5 in the DLQ")

	code, out, errOut = run(t, append([]string{"dlq", "list", "--format", "json", "--app-id", "app-m2,app-m5"}, rabbitArgs(q)...)...)
	require.Equal(t, 0, code, "stderr: %s", errOut)
	require.Contains(t, out, `"app_id": "app-m2"`)
	require.Contains(t, out, `"app_id": "app-m5"`)
	require.NotContains(t, out, `"app_id": "app-m1"`)
}

// deleteNATS removes the streams of exchange, for cleanup.
func deleteNATS(t *testing.T, exchange string) {
	nc, err := natsgo.Connect(testenv.NATSURL())
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, s := range []string{nats.StreamName(exchange), nats.StreamName(exchange) + "-dlq"} {
		_ = js.DeleteStream(ctx, s)
	}
}

// TestDLQNATSExchange: on NATS the queue is found on its exchange without
// --exchange (the new-user case that printed "0 dead message(s)"); with a
// wrong --exchange, or a queue that exists nowhere, the command fails
// with exit 1 and says which flag to check.
func TestDLQNATSExchange(t *testing.T) {
	testenv.RequireTCP(t, "nats", testenv.HostPort(testenv.NATSURL()))
	base := testenv.UniqueName("cli-ndq")
	tp := broker.Topology{Exchange: base + "-ndx", Queues: []broker.Queue{{Name: base + "-ndq", Bindings: []string{"notification.requested"}}}}
	other := broker.Topology{Exchange: base + "-other", Queues: []broker.Queue{{Name: base + "-oq", Bindings: []string{"x"}}}}
	t.Cleanup(func() { deleteNATS(t, tp.Exchange); deleteNATS(t, other.Exchange) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := nats.New(ctx, nats.Config{URL: testenv.NATSURL()})
	require.NoError(t, err)
	defer b.Close()
	deadLetters(t, b, tp, "n1")
	require.NoError(t, b.Declare(ctx, other))
	q := tp.Queues[0].Name
	natsArgs := func(more ...string) []string {
		return append([]string{"--broker", "nats", "--nats-url", testenv.NATSURL(), "--queue"}, more...)
	}

	code, out, errOut := run(t, append([]string{"dlq", "list"}, natsArgs(q)...)...)
	require.Equal(t, 0, code, "stderr: %s", errOut)
	require.Contains(t, out, "n1")
	require.Contains(t, out, "1 dead message(s)")

	code, out, errOut = run(t, append([]string{"dlq", "list"}, natsArgs(q, "--exchange", tp.Exchange)...)...)
	require.Equal(t, 0, code, "stderr: %s", errOut)
	require.Contains(t, out, "1 dead message(s)")

	code, out, errOut = run(t, append([]string{"dlq", "list"}, natsArgs(q, "--exchange", other.Exchange)...)...)
	require.Equal(t, 1, code, "stdout %q", out)
	require.Contains(t, errOut, fmt.Sprintf("ferry: dlq list: no queue %q on nats exchange %q", q, other.Exchange))
	require.Contains(t, errOut, "--exchange")

	code, out, errOut = run(t, append([]string{"dlq", "replay", "--all"}, natsArgs(q+"-typo")...)...)
	require.Equal(t, 1, code, "stdout %q", out)
	require.Contains(t, errOut, fmt.Sprintf("ferry: dlq replay: no queue %q on any nats exchange", q+"-typo"))
	require.Contains(t, errOut, "--exchange")

	code, out, errOut = run(t, append([]string{"dlq", "replay", "--all"}, natsArgs(q)...)...)
	require.Equal(t, 0, code, "stderr: %s", errOut)
	require.Contains(t, out, "replayed 1 message(s)")
}

// TestDLQCommandsNameTheSQSQueue: on SQS, dlq list, replay and purge name
// the real SQS queue of the DLQ (the name the AWS console and ElasticMQ
// show), not only ferry's logical "<queue>.dlq", with and without
// --exchange.
func TestDLQCommandsNameTheSQSQueue(t *testing.T) {
	testenv.RequireTCP(t, "sqs", testenv.HostPort(testenv.SQSEndpoint()))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ex, q := testenv.UniqueName("cli-sqs.ex"), testenv.UniqueName("cli-sqs.work")
	tp := broker.Topology{Exchange: ex, Queues: []broker.Queue{{Name: q, Bindings: []string{"notification.requested"}}}}
	b, err := sqs.New(ctx, sqs.Config{Endpoint: testenv.SQSEndpoint(), Region: testenv.AWSRegion()})
	require.NoError(t, err)
	defer b.Close()
	t.Cleanup(func() {
		for _, n := range []string{sqs.QueueName(ex, q, false), sqs.QueueName(ex, q+".dlq", false)} {
			if u, err := b.Client().GetQueueUrl(context.Background(), &awssqs.GetQueueUrlInput{QueueName: aws.String(n)}); err == nil {
				_, _ = b.Client().DeleteQueue(context.Background(), &awssqs.DeleteQueueInput{QueueUrl: u.QueueUrl})
			}
		}
	})
	deadLetters(t, b, tp, "s1", "s2")
	real := `SQS queue "` + sqs.QueueName(ex, q+".dlq", false) + `"`
	args := func(more ...string) []string {
		return append([]string{"--broker", "sqs", "--sqs-endpoint", testenv.SQSEndpoint(), "--aws-region", testenv.AWSRegion(), "--queue", q}, more...)
	}

	code, out, errOut := run(t, append([]string{"dlq", "list"}, args()...)...)
	require.Equal(t, 0, code, "stderr: %s", errOut)
	require.Contains(t, out, "2 dead message(s) in the DLQ "+q+".dlq ("+real+")")
	code, out, errOut = run(t, append([]string{"dlq", "list"}, args("--exchange", ex)...)...)
	require.Equal(t, 0, code, "stderr: %s", errOut)
	require.Contains(t, out, "("+real+")")

	code, out, errOut = run(t, append([]string{"dlq", "replay", "--id", "s1", "--dry-run"}, args()...)...)
	require.Equal(t, 0, code, "stderr: %s", errOut)
	require.Contains(t, out, "would replay 1 message(s) from the DLQ "+q+".dlq ("+real+")")
	code, out, errOut = run(t, append([]string{"dlq", "purge", "--id", "s2,absent", "--yes"}, args()...)...)
	require.Equal(t, 1, code, "one ID is not in the DLQ")
	require.Empty(t, out, "a failing command prints no result line")
	require.Contains(t, errOut, "1 of 2 requested ID(s) not in the DLQ "+q+".dlq ("+real+"): absent; the other 1 purged: s2")
}

// TestDLQListFirstFailedOfAMessageNeverRetried: a message dead-lettered at
// its first failure (a permanent error, an invalid event) shows when it
// failed, in the table and in JSON, instead of "-".
func TestDLQListFirstFailedOfAMessageNeverRetried(t *testing.T) {
	base := testenv.UniqueName("cli-dlq")
	tp := broker.Topology{Exchange: base + ".ex", Queues: []broker.Queue{{
		Name: base + ".work", Bindings: []string{"notification.requested"}, RetryDelays: []time.Duration{30 * time.Second},
	}}}
	q := tp.Queues[0].Name
	t.Cleanup(func() { deleteRabbit(t, tp.Exchange, rabbitQueues(q)...) })
	before := time.Now().Add(-time.Second).Truncate(time.Second)
	deadLetters(t, rabbitBroker(t), tp, "m1")

	code, out, errOut := run(t, append([]string{"dlq", "list"}, rabbitArgs(q)...)...)
	require.Equal(t, 0, code, "stderr: %s", errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3, out) // header, m1, total
	require.Contains(t, lines[0], "FIRST FAILED")
	fields := strings.Fields(lines[1])
	require.Equal(t, "m1", fields[0])
	first, err := time.Parse(time.RFC3339, fields[4])
	require.NoError(t, err, "FIRST FAILED of %q", lines[1])
	require.WithinRange(t, first, before, time.Now().Add(time.Second))

	code, out, errOut = run(t, append([]string{"dlq", "list", "--format", "json"}, rabbitArgs(q)...)...)
	require.Equal(t, 0, code, "stderr: %s", errOut)
	var items []struct {
		FirstFailedAt *time.Time `json:"first_failed_at"`
		DeadAt        *time.Time `json:"dead_at"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &items))
	require.Len(t, items, 1)
	require.NotNil(t, items[0].FirstFailedAt, out)
	require.Equal(t, *items[0].DeadAt, *items[0].FirstFailedAt, "its only attempt failed when it was dead-lettered")
}
