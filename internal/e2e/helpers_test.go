package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/cmd/ferry/ferrycli"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// brokerServer says how the tests reach the real server of a broker in
// ferrycli.Brokers and which services.sh name stops and starts it.
type brokerServer struct {
	urlFlag string
	url     func() string
	service string
}

var brokerServers = map[string]brokerServer{
	"rabbitmq": {"--rabbitmq-url", testenv.RabbitMQURL, "rabbitmq"},
	"nats":     {"--nats-url", testenv.NATSURL, "nats"},
	"kafka":    {"--kafka-brokers", func() string { return strings.Join(testenv.KafkaBrokers(), ",") }, "kafka"},
	"sqs":      {"--sqs-endpoint", testenv.SQSEndpoint, "sqs"},
}

// brokerOptions are the addresses of every real server of brokerServers,
// for tests that open a broker in-process through ferrycli.Brokers.
func brokerOptions() ferrycli.BrokerOptions {
	return ferrycli.BrokerOptions{
		RabbitMQURL:  testenv.RabbitMQURL(),
		NATSURL:      testenv.NATSURL(),
		KafkaBrokers: testenv.KafkaBrokers(),
		SQSEndpoint:  testenv.SQSEndpoint(),
		AWSRegion:    testenv.AWSRegion(),
	}
}

// forEachBroker runs f as a subtest for every broker the ferry command
// wires, failing for a broker the tests do not know how to reach. RabbitMQ
// runs twice: with classic queues (the default) and, as subtest
// "rabbitmq-quorum", with --rabbitmq-queue-type quorum (through its
// environment variable, which every ferry command of the subtest reads).
func forEachBroker(t *testing.T, f func(t *testing.T, b string)) {
	for _, name := range ferrycli.BrokerNames() {
		t.Run(name, func(t *testing.T) {
			if _, ok := brokerServers[name]; !ok {
				t.Fatalf("e2e: broker %q is in ferrycli.Brokers but the e2e tests do not know its server: add it to brokerServers", name)
			}
			f(t, name)
		})
		if name == "rabbitmq" {
			t.Run("rabbitmq-quorum", func(t *testing.T) {
				t.Setenv("FERRY_RABBITMQ_QUEUE_TYPE", "quorum")
				f(t, name)
			})
		}
	}
}

// forEachBrokerAndMode runs f on every broker (forEachBroker) with each
// relay mode, the polling relay and the WAL relay.
func forEachBrokerAndMode(t *testing.T, f func(t *testing.T, b, mode string)) {
	forEachBroker(t, func(t *testing.T, b string) {
		for _, mode := range []string{outbox.RelayModePoll, outbox.RelayModeWAL} {
			t.Run(mode, func(t *testing.T) { f(t, b, mode) })
		}
	})
}

// syncBuffer is a bytes.Buffer safe for the concurrent writes of a
// running command's logs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is a ferry command running in-process in a goroutine.
type proc struct {
	args     []string
	cancel   context.CancelFunc
	done     chan int
	out, err syncBuffer
	code     int
	stopped  bool
}

// startFerry runs ferry with args until stop (or the test's end).
func startFerry(t *testing.T, args ...string) *proc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &proc{args: args, cancel: cancel, done: make(chan int, 1)}
	go func() { p.done <- ferrycli.Main(ctx, append([]string{"ferry"}, args...), &p.out, &p.err) }()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("ferry %s\nstdout:\n%s\nstderr (last 8 KiB):\n%s", strings.Join(args, " "), p.out.String(), tail(p.err.String(), 8<<10))
		}
	})
	return p
}

// stop cancels the command (as SIGINT would) and returns its exit code.
func (p *proc) stop(t *testing.T) int {
	t.Helper()
	if p.stopped {
		return p.code
	}
	p.stopped = true
	p.cancel()
	select {
	case p.code = <-p.done:
	case <-time.After(90 * time.Second):
		t.Errorf("ferry %s did not stop within 90s", strings.Join(p.args, " "))
		p.code = -1
	}
	return p.code
}

// exited reports the exit code when the command ended by itself.
func (p *proc) exited() (int, bool) {
	if p.stopped {
		return p.code, true
	}
	select {
	case p.code = <-p.done:
		p.stopped = true
		return p.code, true
	default:
		return 0, false
	}
}

// ferry runs a one-shot ferry command and returns its exit code, stdout
// and stderr.
func ferry(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out, errOut syncBuffer
	code := ferrycli.Main(ctx, append([]string{"ferry"}, args...), &out, &errOut)
	return code, out.String(), errOut.String()
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// stack is one test's settings: its database, broker and names.
type stack struct {
	t        *testing.T
	broker   string
	dbURL    string
	exchange string
	queue    string
	tag      string
	// relayMode is ferry run's --relay-mode ("": the default, poll);
	// with "wal" run also passes a --wal-slot of the test's own.
	relayMode string
}

// newStack makes a fresh database (migrated through `ferry migrate`) and
// unique exchange, queue and mail tag for broker b.
func newStack(t *testing.T, b string) *stack {
	t.Helper()
	s := &stack{
		t:        t,
		broker:   b,
		dbURL:    testenv.NewDatabase(t),
		exchange: testenv.UniqueName("e2e-ex"),
		queue:    testenv.UniqueName("e2e-q"),
		tag:      fmt.Sprintf("e2e-%s-%d", b, time.Now().UnixNano()),
	}
	code, _, errOut := ferry(t, "migrate", "--database-url", s.dbURL)
	require.Equal(t, 0, code, "ferry migrate: %s", errOut)
	return s
}

// dlqArgs are the flags a dlq command takes to find the test's DLQ: the
// broker and the names (the dlq commands declare nothing, so they take no
// --retry-delay).
func (s *stack) dlqArgs() []string {
	args := s.brokerArgs("")
	return args[:len(args)-2]
}

// brokerArgs are the flags selecting the test's broker and names.
func (s *stack) brokerArgs(retryDelay string) []string {
	srv := brokerServers[s.broker]
	return []string{"--broker", s.broker, srv.urlFlag, srv.url(), "--exchange", s.exchange, "--queue", s.queue, "--retry-delay", retryDelay}
}

// run starts `ferry run` on a free loopback port with the extra flags and
// returns the process and the API's base URL.
func (s *stack) run(retryDelay string, extra ...string) (*proc, string) {
	s.t.Helper()
	addr := freeAddr(s.t)
	args := append([]string{"run", "--database-url", s.dbURL, "--addr", addr, "--shutdown-timeout", "5s", "--poll-interval", "200ms"}, s.brokerArgs(retryDelay)...)
	if s.relayMode == outbox.RelayModeWAL {
		args = append(args, "--relay-mode=wal", "--wal-slot", strings.NewReplacer("-", "_").Replace(strings.ToLower(s.exchange)))
	}
	p := startFerry(s.t, append(args, extra...)...)
	base := "http://" + addr
	waitFor(s.t, 30*time.Second, "the API to answer /healthz", func() (bool, string) {
		if code, ok := p.exited(); ok {
			s.t.Fatalf("ferry run exited with %d before the API answered:\n%s", code, tail(p.err.String(), 4<<10))
		}
		resp, err := http.Get(base + "/healthz")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == 200, resp.Status
	})
	return p, base
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

// waitFor polls cond every 200 ms until it holds or timeout passes; the
// failure message names what was awaited and the last state seen.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		var ok bool
		if ok, last = cond(); ok {
			return
		}
	}
	t.Fatalf("timed out after %v waiting for %s; last: %s", timeout, what, last)
}

// post creates n notifications through the API, each with the test's tag
// in the subject, and returns their ids.
func (s *stack) post(base string, n int) []string {
	s.t.Helper()
	ids := make([]string, 0, n)
	for i := range n {
		body, _ := json.Marshal(map[string]string{
			"user_id": fmt.Sprintf("u-%d", i%7),
			"channel": "email",
			"to":      fmt.Sprintf("user%d@example.com", i),
			"subject": fmt.Sprintf("%s #%d", s.tag, i),
			"body":    "Привет from the end-to-end test ✉",
		})
		resp, err := http.Post(base+"/notifications", "application/json", bytes.NewReader(body))
		require.NoError(s.t, err)
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(s.t, http.StatusCreated, resp.StatusCode, "POST /notifications: %s", data)
		var created struct{ ID string }
		require.NoError(s.t, json.Unmarshal(data, &created))
		ids = append(ids, created.ID)
	}
	return ids
}

// notification reads GET /notifications/{id}.
func notification(t *testing.T, base, id string) map[string]any {
	t.Helper()
	resp, err := http.Get(base + "/notifications/" + id)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var n map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&n))
	return n
}

// outboxStats runs `ferry outbox stats --format json`.
func (s *stack) outboxStats() (unprocessed int64, raw string) {
	s.t.Helper()
	code, out, errOut := ferry(s.t, "outbox", "stats", "--database-url", s.dbURL, "--format", "json")
	require.Equal(s.t, 0, code, "ferry outbox stats: %s", errOut)
	var st struct {
		Unprocessed *int64 `json:"unprocessed"`
	}
	require.NoError(s.t, json.Unmarshal([]byte(out), &st), out)
	require.NotNil(s.t, st.Unprocessed, out)
	return *st.Unprocessed, out
}

// mailpitMessageIDs returns the distinct Message-IDs of the mails whose
// subject contains tag.
func mailpitMessageIDs(t *testing.T, tag string) (distinct map[string]bool, total int) {
	t.Helper()
	q := url.Values{"query": {`subject:"` + tag + `"`}, "limit": {"5000"}}
	resp, err := http.Get(testenv.MailpitURL() + "/api/v1/search?" + q.Encode())
	if err != nil {
		testenv.Require(t, "mailpit")
	}
	require.NoError(t, err, "Mailpit API at %s", testenv.MailpitURL())
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var res struct {
		Messages []struct {
			MessageID string `json:"MessageID"`
			Subject   string `json:"Subject"`
		} `json:"messages"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&res))
	distinct = map[string]bool{}
	for _, m := range res.Messages {
		if strings.Contains(m.Subject, tag) {
			distinct[m.MessageID] = true
			total++
		}
	}
	return distinct, total
}

// unsetFerryEnv removes every FERRY_* variable for the test, so a command
// sees only its flags (restored when the test ends).
func unsetFerryEnv(t *testing.T) {
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "FERRY_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
}
