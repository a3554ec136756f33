package suite

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Host describes the machine a run measured on.
type Host struct {
	CPU         string `json:"cpu"`
	Cores       int    `json:"cores"`
	MemoryBytes int64  `json:"memory_bytes"`
	Kernel      string `json:"kernel"`
	Go          string `json:"go"`
	// LoadAverage is the 1-minute load average at the start: how busy the
	// (possibly shared) machine was.
	LoadAverage string `json:"load_average"`
}

func readHost() Host {
	h := Host{Cores: runtime.NumCPU(), Go: runtime.Version(), CPU: "unknown", Kernel: "unknown", LoadAverage: "unknown"}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		s := bufio.NewScanner(f)
		for s.Scan() {
			if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				h.CPU = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		s := bufio.NewScanner(f)
		for s.Scan() {
			var kb int64
			if _, err := fmt.Sscanf(s.Text(), "MemTotal: %d kB", &kb); err == nil {
				h.MemoryBytes = kb * 1024
				break
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		h.Kernel = "Linux " + strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			h.LoadAverage = f[0]
		}
	}
	return h
}

// loadAverage returns the 1-minute load average of /proc/loadavg, 0 when
// it cannot be read.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var v float64
	if _, err := fmt.Sscan(string(b), &v); err != nil {
		return 0
	}
	return v
}

// clientModules are the client libraries whose versions a run records.
var clientModules = []string{
	"github.com/jackc/pgx/v5", "github.com/rabbitmq/amqp091-go", "github.com/nats-io/nats.go",
	"github.com/segmentio/kafka-go", "github.com/aws/aws-sdk-go-v2/service/sqs",
	"github.com/nats-io/nats-server/v2", "github.com/fergusstrange/embedded-postgres",
}

// clientVersions returns the versions of the client libraries built into
// this binary, from its build information.
func clientVersions() map[string]string {
	out := map[string]string{"go": runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return out
	}
	for _, d := range bi.Deps {
		for _, m := range clientModules {
			if d.Path == m {
				out[m] = d.Version
			}
		}
	}
	return out
}

// postgresVersion returns the server's version string.
func postgresVersion(ctx context.Context, url string) (string, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", fmt.Errorf("bench: connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var v string
	if err := conn.QueryRow(ctx, `SHOW server_version`).Scan(&v); err != nil {
		return "", fmt.Errorf("bench: PostgreSQL version: %w", err)
	}
	return "PostgreSQL " + v, nil
}
