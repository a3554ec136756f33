package rabbitmq_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/brokers/rabbitmq"
	"github.com/ferrymq/ferry/internal/roomtest"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// TestNoRoomMemoryAlarm (issue 29): a memory alarm
// (set_vm_memory_high_watermark 0) on a RabbitMQ node of this test only,
// so that nobody else's publishes stop. RabbitMQ sends connection.blocked
// and stops reading from the publishing connection (RabbitMQ docs,
// "Blocked Connection Notifications"); the adapter turns that into
// broker.ErrBlocked at once instead of a publish that waits for its
// timeout, and the relay says it is blocked, once, holds its rows and
// publishes them all when the watermark is back (roomtest.Run), with the
// polling relay and with the WAL relay. The node
// starts in about 7 s (no plugins).
func TestNoRoomMemoryAlarm(t *testing.T) {
	n := startNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, mode := range []string{outbox.RelayModePoll, outbox.RelayModeWAL} {
		t.Run(mode, func(t *testing.T) {
			// One adapter publishes to one exchange.
			b, err := rabbitmq.New(ctx, rabbitmq.Config{URL: n.url, ReconnectDelay: 200 * time.Millisecond})
			require.NoError(t, err)
			t.Cleanup(func() { b.Close() })
			tp := broker.Topology{Exchange: testenv.UniqueName("room") + ".ex", Queues: []broker.Queue{{Name: testenv.UniqueName("room") + ".work", Bindings: []string{"evt.#"}}}}
			require.NoError(t, b.Declare(ctx, tp))
			roomtest.Run(t, roomtest.Case{
				Broker: b, Topology: tp, Type: "evt.room", Reason: "memory", Mode: mode,
				// Long enough that a publish that waited for it would
				// show in ToBlocked.
				PublishTimeout: 10 * time.Second,
				Block:          func(t *testing.T) { n.ctl(t, "set_vm_memory_high_watermark", "0") },
				Unblock:        func(t *testing.T) { n.ctl(t, "set_vm_memory_high_watermark", "0.4") },
			})
		})
	}
}

// node is a RabbitMQ node a test started: its own name, ports and data
// folder (as compose/local/cluster.sh starts the rabbitmq-cluster role's).
type node struct {
	name, url, bin string
	env            []string
}

func (n *node) ctl(t *testing.T, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(n.bin, "rabbitmqctl"), append([]string{"-q", "-n", n.name}, args...)...)
	cmd.Env = n.env
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "rabbitmqctl %v: %s", args, out)
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startNode starts a RabbitMQ node without plugins and stops it (and
// removes its data) when the test ends.
func startNode(t *testing.T) *node {
	t.Helper()
	bin := testenv.Env("FERRY_RABBITMQ_BIN", "/usr/lib/rabbitmq/bin")
	_, err := os.Stat(filepath.Join(bin, "rabbitmq-server"))
	require.NoError(t, err, "RabbitMQ is not installed (compose/local/services.sh up rabbitmq installs it)")
	dir := t.TempDir()
	amqpPort, distPort := freePort(t), freePort(t)
	n := &node{name: fmt.Sprintf("ferryroom%d@localhost", os.Getpid()), url: fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", amqpPort), bin: bin}
	files := map[string]string{
		"rabbitmq.conf":   fmt.Sprintf("listeners.tcp.1 = 127.0.0.1:%d\n", amqpPort),
		"enabled_plugins": "[].\n",
		"env.conf":        "",
	}
	for name, body := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644))
	}
	n.env = append(os.Environ(),
		"RABBITMQ_NODENAME="+n.name, "RABBITMQ_USE_LONGNAME=false",
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(dir, "env.conf"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_LOGS="+filepath.Join(dir, "rabbit.log"),
		"RABBITMQ_PID_FILE="+filepath.Join(dir, "rabbit.pid"),
		fmt.Sprintf("RABBITMQ_DIST_PORT=%d", distPort),
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
	)
	var out testenv.LockedBuffer
	cmd := exec.Command(filepath.Join(bin, "rabbitmq-server"))
	cmd.Env, cmd.Stdout, cmd.Stderr = n.env, &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		stop := exec.CommandContext(ctx, filepath.Join(bin, "rabbitmqctl"), "-q", "-n", n.name, "stop")
		stop.Env = n.env
		_ = stop.Run()
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // our process group only
			<-exited
		}
	})
	start := time.Now()
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", amqpPort), time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("rabbitmq node %s exited during start: %v\n%s", n.name, err, out.String())
		case <-time.After(100 * time.Millisecond):
		}
		require.Less(t, time.Since(start), 90*time.Second, "node %s not up:\n%s", n.name, out.String())
	}
	t.Logf("rabbitmq node %s up on :%d in %v", n.name, amqpPort, time.Since(start).Round(time.Millisecond))
	return n
}
