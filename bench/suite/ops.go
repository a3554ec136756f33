package suite

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ferrymq/ferry/internal/procstat"
)

// Operations is what running one server takes on this machine, read
// from /proc at the end of a run: the processes of its tree and their
// resident memory.
type Operations struct {
	Name      string   `json:"name"`
	Processes int      `json:"processes"`
	RSSBytes  int64    `json:"rss_bytes"`
	Commands  []string `json:"commands,omitempty"` // distinct executable names
	Note      string   `json:"note,omitempty"`
}

// Capabilities is what a broker's adapter declares
// (broker.Capabilities), recorded beside the measurements that check it.
type Capabilities struct {
	Ordering           string `json:"ordering"`
	Replay             bool   `json:"replay"`
	Wildcards          bool   `json:"wildcards"`
	NativeDelay        bool   `json:"native_delay"`
	MaxDelay           string `json:"max_delay,omitempty"`
	MaxMessageBytes    int    `json:"max_message_bytes,omitempty"`
	CountsRedeliveries bool   `json:"counts_redeliveries"`
}

// serverOps measures the server listening on rawURL's port.
func serverOps(name, rawURL string) Operations {
	op := Operations{Name: name}
	u, err := url.Parse(rawURL)
	if err != nil {
		op.Note = err.Error()
		return op
	}
	_, p, err := net.SplitHostPort(u.Host)
	if err != nil {
		op.Note = "no port in " + rawURL
		return op
	}
	port, _ := strconv.Atoi(p)
	pid, err := procstat.ListenerPID(port)
	if err != nil {
		op.Note = err.Error()
		return op
	}
	if pid == os.Getpid() {
		op.Note = "runs inside the ferry process"
		return op
	}
	all, err := procstat.All()
	if err != nil {
		op.Note = err.Error()
		return op
	}
	children := map[int][]procstat.Stat{}
	byPID := map[int]procstat.Stat{}
	for _, s := range all {
		children[s.PPID] = append(children[s.PPID], s)
		byPID[s.PID] = s
	}
	seen := map[string]bool{}
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		op.Processes++
		op.RSSBytes += rss(p)
		if s, ok := byPID[p]; ok && !seen[s.Comm] {
			seen[s.Comm] = true
			op.Commands = append(op.Commands, s.Comm)
		}
		for _, c := range children[p] {
			queue = append(queue, c.PID)
		}
	}
	return op
}

// rss reads VmRSS of /proc/<pid>/status, in bytes (0 when gone).
func rss(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		var kb int64
		if _, err := fmt.Sscanf(s.Text(), "VmRSS: %d kB", &kb); err == nil {
			return kb * 1024
		}
	}
	return 0
}

// collectOps records each broker's capabilities and every server's
// processes and memory.
func (r *runner) collectOps(ctx context.Context, res *Results) {
	res.Capabilities = map[string]Capabilities{}
	for _, t := range r.cfg.Targets {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		br, err := t.Open(cctx)
		cancel()
		if err == nil {
			c := br.Capabilities()
			ci := Capabilities{Ordering: c.Ordering.String(), Replay: c.Replay, Wildcards: c.Wildcards, NativeDelay: c.NativeDelay,
				MaxMessageBytes: c.MaxMessageBytes, CountsRedeliveries: c.CountsRedeliveries}
			if c.MaxDelay > 0 {
				ci.MaxDelay = c.MaxDelay.String()
			}
			res.Capabilities[t.Name] = ci
			_ = br.Close()
		}
		if t.URL != "" {
			res.Operations = append(res.Operations, serverOps(t.Name, t.serverURL()))
		}
	}
	res.Operations = append(res.Operations, serverOps("postgres", r.cfg.DatabaseURL))
	res.Operations = append(res.Operations, r.clusterOps...)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// writeOps writes the capabilities and operations tables.
func writeOps(w *strings.Builder, res *Results) {
	if len(res.Capabilities) > 0 {
		fmt.Fprintf(w, "\n## capabilities (declared by each adapter)\n\n| broker | ordering scope | replay | wildcard bindings | native delay | max delay | max message (bytes) | counts redeliveries |\n|---|---|---|---|---|---|---:|---|\n")
		for _, name := range sortedKeys(res.Capabilities) {
			c := res.Capabilities[name]
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %d | %s |\n", name, c.Ordering, yesNo(c.Replay), yesNo(c.Wildcards), yesNo(c.NativeDelay), c.MaxDelay, c.MaxMessageBytes, yesNo(c.CountsRedeliveries))
		}
	}
	if len(res.Operations) > 0 {
		fmt.Fprintf(w, "\n## operations (each server at the end of the run)\n\n| server | processes | resident memory (MiB) | executables | note |\n|---|---:|---:|---|---|\n")
		for _, o := range res.Operations {
			fmt.Fprintf(w, "| %s | %d | %.0f | %s | %s |\n", o.Name, o.Processes, float64(o.RSSBytes)/(1<<20), strings.Join(o.Commands, ", "), o.Note)
		}
	}
}
