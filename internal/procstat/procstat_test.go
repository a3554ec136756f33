package procstat

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseStatCommWithSpacesAndParens(t *testing.T) {
	line := "4242 (a b) c)) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 75 30 20 20 0 3 0 12345 1000 100 18446744073709551615\n"
	st, err := parseStat([]byte(line))
	require.NoError(t, err)
	require.Equal(t, Stat{PID: 4242, PPID: 17, Comm: "a b) c)", CPU: 3250 * time.Millisecond, ChildrenCPU: 500 * time.Millisecond}, st)
}

func TestParseStatRejectsMalformed(t *testing.T) {
	for _, line := range []string{"", "12 no parens S 1", "12 (short) S 1 2 3", "x (c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15"} {
		_, err := parseStat([]byte(line))
		require.Error(t, err, "%q", line)
	}
}

// burn spins the CPU for d.
func burn(d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); {
	}
}

func rusageSelf(t *testing.T) time.Duration {
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// The CPU this test process burns shows in ReadStat and TreeCPU, and
// agrees with getrusage(2) within a few clock ticks.
func TestReadStatMatchesRusageOfOwnProcess(t *testing.T) {
	st0, err := ReadStat(os.Getpid())
	require.NoError(t, err)
	ru0 := rusageSelf(t)
	// 0.3 s of CPU, however long a loaded machine makes that take.
	for rusageSelf(t)-ru0 < 300*time.Millisecond {
		burn(5 * time.Millisecond)
	}
	st1, err := ReadStat(os.Getpid())
	require.NoError(t, err)
	ru1 := rusageSelf(t)

	got, want := st1.CPU-st0.CPU, ru1-ru0
	require.GreaterOrEqual(t, want, 300*time.Millisecond)
	require.InDelta(t, want.Seconds(), got.Seconds(), 0.05, "stat %v, rusage %v", got, want)
	require.Equal(t, os.Getppid(), st1.PPID)
}

// A tree's CPU includes a busy grandchild while it runs and keeps it after
// the grandchild exited and was reaped (then it is in its parent's
// cutime+cstime).
func TestTreeCPUCountsLiveAndExitedDescendants(t *testing.T) {
	// sh starts a busy child (this test binary burning 0.5 s of CPU),
	// waits for it, then sleeps so the test can sample after the reap.
	cmd := exec.Command("sh", "-c", `"$0" & wait; sleep 30`, os.Args[0])
	cmd.Env = append(os.Environ(), "PROCSTAT_BURN_CHILD=1")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid

	before, err := TreeCPU(pid)
	require.NoError(t, err)
	var duringChild bool
	var after time.Duration
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		all, err := All()
		require.NoError(t, err)
		hasChild := false
		for _, st := range all {
			if st.PPID == pid && st.Comm != "sleep" {
				hasChild = true
			}
		}
		after, err = TreeCPU(pid)
		require.NoError(t, err)
		if hasChild && after-before > 100*time.Millisecond {
			duringChild = true
		}
		if !hasChild && duringChild {
			break
		}
	}
	require.True(t, duringChild, "the busy grandchild's CPU never showed in the tree while it ran")
	root, err := ReadStat(pid)
	require.NoError(t, err)
	require.GreaterOrEqual(t, root.ChildrenCPU, 400*time.Millisecond, "the reaped child's CPU is in its parent's cutime+cstime")
	require.GreaterOrEqual(t, after-before, 400*time.Millisecond)
}

func TestTreeCPUAndReadStatOfMissingProcess(t *testing.T) {
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	_, err := ReadStat(cmd.Process.Pid)
	require.True(t, errors.Is(err, ErrNotFound), "%v", err)
	_, err = TreeCPU(cmd.Process.Pid)
	require.True(t, errors.Is(err, ErrNotFound), "%v", err)
}

func TestListenerPIDFindsTheListeningProcess(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	pid, err := ListenerPID(port)
	require.NoError(t, err)
	require.Equal(t, os.Getpid(), pid)

	require.NoError(t, ln.Close())
	_, err = ListenerPID(port)
	require.True(t, errors.Is(err, ErrNotFound), "%v", err)
}

// TestMain doubles as the child processes of the tests: with
// PROCSTAT_BURN_CHILD=1 the test binary only burns 0.5 s of CPU; with
// PROCSTAT_LISTEN_CHILD=1 it only listens on a free port, prints it and
// waits to be killed.
func TestMain(m *testing.M) {
	if os.Getenv("PROCSTAT_BURN_CHILD") == "1" {
		// 0.5 s of CPU, however long a loaded machine makes that take.
		for {
			var ru syscall.Rusage
			if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil || ru.Utime.Nano()+ru.Stime.Nano() >= int64(500*time.Millisecond) {
				os.Exit(0)
			}
			burn(10 * time.Millisecond)
		}
	}
	if os.Getenv("PROCSTAT_LISTEN_CHILD") == "1" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			os.Exit(1)
		}
		fmt.Println(ln.Addr().(*net.TCPAddr).Port)
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestListenerPIDOfAnotherProcess(t *testing.T) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "PROCSTAT_LISTEN_CHILD=1")
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	port, err := strconv.Atoi(strings.TrimSpace(line))
	require.NoError(t, err)
	pid, err := ListenerPID(port)
	require.NoError(t, err)
	require.Equal(t, cmd.Process.Pid, pid)
	require.NotEqual(t, os.Getpid(), pid)
}
