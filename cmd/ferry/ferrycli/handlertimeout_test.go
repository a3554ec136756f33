package ferrycli_test

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/rabbitmq"
	"github.com/ferrymq/ferry/internal/testenv"
)

// --handler-timeout is checked against the broker's settle limit at
// start: on RabbitMQ, whose consumer_timeout is 30 minutes by default, a
// worker allowed 45 minutes per attempt refuses to start (exit 2, a
// configuration error) naming both settings and a value that works. A
// negative value is a usage error.
func TestHandlerTimeoutFlag(t *testing.T) {
	code, out, errOut := run(t, "worker", "--help")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "--handler-timeout value")
	require.Contains(t, out, "$FERRY_HANDLER_TIMEOUT")
	code, _, errOut = run(t, "worker", "--handler-timeout", "-1s")
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, "--handler-timeout -1s: must not be negative")

	db := testenv.NewDatabase(t)
	code, _, errOut = run(t, "migrate", "--database-url", db)
	require.Equal(t, 0, code, errOut)
	name := testenv.UniqueName("htimeout")
	t.Cleanup(func() { deleteRabbitTopology(t, name, name+".work") })
	code, _, errOut = run(t, "worker", "--database-url", db, "--broker", "rabbitmq", "--rabbitmq-url", testenv.RabbitMQURL(),
		"--exchange", name, "--queue", name+".work", "--handler-timeout", "45m")
	require.Equal(t, 2, code, errOut)
	for _, w := range []string{"--handler-timeout", "= 45m0s", "consumer_timeout", "= 30m0s", "below 30m0s, e.g. 27m0s"} {
		require.Contains(t, errOut, w)
	}
}

// deleteRabbitTopology deletes the exchange and the queues of queue that
// a ferry command declared.
func deleteRabbitTopology(t *testing.T, exchange, queue string) {
	conn, err := amqp.Dial(testenv.RabbitMQURL())
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	_ = ch.ExchangeDelete(exchange, false, false)
	for _, n := range rabbitmq.QueueNames(broker.Queue{Name: queue, RetryDelays: []time.Duration{30 * time.Second}}) {
		_, _ = ch.QueueDelete(n, false, false, false)
	}
}
