// Package procstat reads the CPU time of local processes from Linux's
// /proc, for the benchmarks' CPU-per-event figures: the CPU a process tree
// (a PostgreSQL server and its backends, a RabbitMQ node, a NATS server,
// the benchmark's own process) used between two samples.
//
// Figures come from /proc/<pid>/stat (proc(5)): utime and stime of every
// thread of a process, plus cutime and cstime, the times of its children
// that exited and were waited for. A tree's CPU is the sum over the root
// and its live descendants of all four, so a backend that exits between
// two samples is still counted, in its parent's cutime and cstime. Clock
// ticks are USER_HZ, 100 per second on every Linux architecture Go runs on
// (what sysconf(_SC_CLK_TCK) returns; the kernel's own HZ is not visible
// here).
//
// Only Linux has /proc; elsewhere every function returns an error.
package procstat

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ticksPerSecond is USER_HZ, the unit of the times in /proc/<pid>/stat.
const ticksPerSecond = 100

// procRoot is where procfs is mounted.
const procRoot = "/proc"

// ErrNotFound is returned when no process matches (no such pid, nothing
// listening on a port).
var ErrNotFound = errors.New("procstat: no such process")

// Stat is what procstat uses of one /proc/<pid>/stat line.
type Stat struct {
	PID  int    // the process id
	PPID int    // its parent's process id
	Comm string // the executable's name, at most 15 bytes (comm)
	// CPU is utime+stime, the CPU time of all the process's threads.
	CPU time.Duration
	// ChildrenCPU is cutime+cstime, the CPU time of its children that
	// exited and were waited for.
	ChildrenCPU time.Duration
}

// ReadStat reads /proc/<pid>/stat. It returns an error wrapping
// ErrNotFound when the process does not exist (any more).
func ReadStat(pid int) (Stat, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			return Stat{}, fmt.Errorf("procstat: pid %d: %w", pid, ErrNotFound)
		}
		return Stat{}, fmt.Errorf("procstat: %w", err)
	}
	return parseStat(b)
}

// parseStat parses one /proc/<pid>/stat line (proc(5)). The comm field is
// in parentheses and may itself contain spaces and parentheses, so the
// fields are counted from the last ')'.
func parseStat(b []byte) (Stat, error) {
	open, closing := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || closing < open {
		return Stat{}, fmt.Errorf("procstat: malformed stat line %q", b)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b[:open])))
	if err != nil {
		return Stat{}, fmt.Errorf("procstat: malformed pid in stat line %q", b)
	}
	// After ")": field 3 (state) is rest[0], so field k is rest[k-3].
	rest := strings.Fields(string(b[closing+1:]))
	if len(rest) < 15 {
		return Stat{}, fmt.Errorf("procstat: short stat line %q", b)
	}
	num := func(field int) (int64, error) {
		v, err := strconv.ParseInt(rest[field-3], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("procstat: pid %d: stat field %d %q: %w", pid, field, rest[field-3], err)
		}
		return v, nil
	}
	var v [5]int64
	for i, field := range []int{4, 14, 15, 16, 17} { // ppid utime stime cutime cstime
		if v[i], err = num(field); err != nil {
			return Stat{}, err
		}
	}
	return Stat{
		PID: pid, PPID: int(v[0]), Comm: string(b[open+1 : closing]),
		CPU:         ticks(v[1] + v[2]),
		ChildrenCPU: ticks(v[3] + v[4]),
	}, nil
}

func ticks(n int64) time.Duration { return time.Duration(n) * time.Second / ticksPerSecond }

// All reads the stat of every process. Processes that exit while it reads
// are left out.
func All() ([]Stat, error) {
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, fmt.Errorf("procstat: %w", err)
	}
	out := make([]Stat, 0, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := ReadStat(pid)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

// TreeCPU returns the CPU time used so far by process pid and all its
// descendants: utime+stime+cutime+cstime of each live process in the tree.
// The difference of two calls is the CPU the tree used in between, with
// the processes that exited in between included (their time moved to
// their parent's cutime+cstime). It returns an error wrapping ErrNotFound
// when pid does not exist.
func TreeCPU(pid int) (time.Duration, error) {
	all, err := All()
	if err != nil {
		return 0, err
	}
	children := make(map[int][]Stat, len(all))
	var root *Stat
	for i, st := range all {
		children[st.PPID] = append(children[st.PPID], st)
		if st.PID == pid {
			root = &all[i]
		}
	}
	if root == nil {
		return 0, fmt.Errorf("procstat: pid %d: %w", pid, ErrNotFound)
	}
	var total time.Duration
	var walk func(st Stat)
	walk = func(st Stat) {
		total += st.CPU + st.ChildrenCPU
		for _, c := range children[st.PID] {
			walk(c)
		}
	}
	walk(*root)
	return total, nil
}

// ListenerPID returns the pid of the process that has a TCP socket
// listening on port (IPv4 or IPv6, any address): the server behind a
// local address such as 127.0.0.1:5672. Seeing other users' sockets needs
// the right to read their /proc/<pid>/fd (root, or the same user). It
// returns an error wrapping ErrNotFound when no visible process listens
// there.
func ListenerPID(port int) (int, error) {
	inodes := map[string]bool{}
	for _, f := range []string{"net/tcp", "net/tcp6"} {
		if err := listeningInodes(filepath.Join(procRoot, f), port, inodes); err != nil {
			return 0, err
		}
	}
	if len(inodes) == 0 {
		return 0, fmt.Errorf("procstat: nothing listens on TCP port %d: %w", port, ErrNotFound)
	}
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return 0, fmt.Errorf("procstat: %w", err)
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fds, err := os.ReadDir(filepath.Join(procRoot, e.Name(), "fd"))
		if err != nil {
			continue // exited, or not ours to read
		}
		for _, fd := range fds {
			link, err := os.Readlink(filepath.Join(procRoot, e.Name(), "fd", fd.Name()))
			if err != nil || !strings.HasPrefix(link, "socket:[") {
				continue
			}
			if inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("procstat: the socket listening on TCP port %d belongs to no visible process: %w", port, ErrNotFound)
}

// listeningInodes adds to inodes the socket inodes of file (/proc/net/tcp
// or tcp6) in state LISTEN (0A) on port.
func listeningInodes(file string, port int, inodes map[string]bool) error {
	f, err := os.Open(file)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil // no IPv6
		}
		return fmt.Errorf("procstat: %w", err)
	}
	defer f.Close()
	want := fmt.Sprintf(":%04X", port)
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		fs := strings.Fields(sc.Text())
		if len(fs) < 10 || fs[3] != "0A" || !strings.HasSuffix(fs[1], want) {
			continue
		}
		inodes[fs[9]] = true
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("procstat: %s: %w", file, err)
	}
	return nil
}

// SelfMemory returns this process's Go heap in use after a collection
// (runtime.MemStats.HeapInuse) and its resident set size (VmRSS of
// /proc/self/status; 0 where that file is missing), both in bytes. Tests
// that bound memory during an outage print and compare them.
func SelfMemory() (heap, rss uint64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if raw, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(raw), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseUint(f[1], 10, 64)
				rss = kb << 10
			}
		}
	}
	return ms.HeapInuse, rss
}
