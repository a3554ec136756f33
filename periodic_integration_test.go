package ferry_test

import (
	"bufio"
	"context"
	"encoding/json"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// periodicChildEnv names the database a child process of
// TestPeriodicReplicasKill9 runs its Scheduler on.
const periodicChildEnv = "FERRY_TEST_PERIODIC_CHILD_DSN"

type tickArgs struct {
	Report string `json:"report"`
}

// TestPeriodicChild is the replica TestPeriodicReplicasKill9 starts as a
// child process (this test binary, run with periodicChildEnv set); without
// that variable it does nothing. It runs a Scheduler with one job every
// second until it is killed, logging JSON at debug level on stderr.
func TestPeriodicChild(t *testing.T) {
	dsn := os.Getenv(periodicChildEnv)
	if dsn == "" {
		return
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	job, err := ferry.Periodic("tick", "@every 1s", "report.tick", tickArgs{Report: "daily"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := ferry.NewScheduler(ferry.SchedulerConfig{Pool: pool, Jobs: []*ferry.PeriodicJob{job},
		Logger: slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Run(ctx) // until SIGKILL
}

// TestPeriodicReplicasKill9 runs three replicas of a Scheduler (child
// processes on one database) with a job every second, kills one of them
// with SIGKILL at random moments and restarts it, then kills all three,
// leaves them down for a few ticks and restarts one. It asserts what a
// user relies on: each tick is enqueued exactly once (one outbox event per
// tick, none twice), none is missing while at least one replica runs, and
// of the ticks missed while every replica was down only the latest is
// enqueued, with a warning that counts the others.
//
// The exactly-once tick is decided in PostgreSQL (the job's row lock and
// last_tick, committed with the outbox insert), before any broker is
// involved, so this test needs no broker; Example_periodic runs a periodic
// job through the relay and a worker on NATS.
func TestPeriodicReplicasKill9(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, dsn := testenv.NewPool(t)
	require.NoError(t, outbox.Migrate(ctx, pool))
	dir := t.TempDir()

	type child struct {
		cmd *exec.Cmd
		log string
	}
	var logs []string
	start := func() *child {
		f, err := os.CreateTemp(dir, "child-*.log")
		require.NoError(t, err)
		cmd := exec.Command(os.Args[0], "-test.run=^TestPeriodicChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), periodicChildEnv+"="+dsn)
		cmd.Stderr, cmd.Stdout = f, f
		require.NoError(t, cmd.Start())
		f.Close()
		logs = append(logs, f.Name())
		return &child{cmd: cmd, log: f.Name()}
	}
	kill := func(c *child) {
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
		_ = c.cmd.Wait()
	}
	replicas := []*child{start(), start(), start()}
	defer func() {
		for _, c := range replicas {
			if c != nil {
				kill(c)
			}
		}
	}()

	// Phase 1: 10 s, one replica killed and restarted at random moments
	// (on average twice a second, so many kills land inside a tick's
	// transaction); two or three always run.
	phase1 := time.Now()
	kills := 0
	for time.Since(phase1) < 10*time.Second {
		time.Sleep(time.Duration(200+rand.IntN(600)) * time.Millisecond)
		i := rand.IntN(len(replicas))
		kill(replicas[i])
		kills++
		replicas[i] = start()
	}
	// Phase 2: everything down for 3.5 s (three or four ticks), then one
	// replica back for 2.5 s.
	downAt := time.Now()
	for i, c := range replicas {
		kill(c)
		replicas[i] = nil
	}
	time.Sleep(3500 * time.Millisecond)
	upAt := time.Now()
	replicas[0] = start()
	time.Sleep(2500 * time.Millisecond)
	kill(replicas[0])
	replicas[0] = nil

	rows, err := pool.Query(ctx, `SELECT headers->>$1, event_type, payload FROM outbox ORDER BY id`, broker.HeaderAppID)
	require.NoError(t, err)
	count := map[time.Time]int{}
	var ticks []time.Time
	for rows.Next() {
		var appID, typ string
		var body []byte
		require.NoError(t, rows.Scan(&appID, &typ, &body))
		require.Equal(t, "report.tick", typ)
		require.JSONEq(t, `{"report":"daily"}`, string(body))
		name, at, ok := strings.Cut(appID, "@")
		require.True(t, ok && name == "tick", "app id %q", appID)
		tick, err := time.Parse(time.RFC3339Nano, at)
		require.NoError(t, err)
		if count[tick] == 0 {
			ticks = append(ticks, tick)
		}
		count[tick]++
	}
	require.NoError(t, rows.Err())
	slices.SortFunc(ticks, func(a, b time.Time) int { return a.Compare(b) })
	for _, tk := range ticks {
		require.Equal(t, 1, count[tk], "tick %v enqueued %d times", tk, count[tk])
	}
	require.NotEmpty(t, ticks)

	// One gap, across the outage; every other tick is one second after
	// the previous.
	gaps := 0
	var before, after time.Time
	for i := 1; i < len(ticks); i++ {
		if d := ticks[i].Sub(ticks[i-1]); d != time.Second {
			gaps++
			before, after = ticks[i-1], ticks[i]
		}
	}
	require.Equal(t, 1, gaps, "ticks: %v", ticks)
	require.False(t, before.After(downAt), "last tick before the outage %v is after it started %v", before, downAt)
	// The replica's process starts in some tens of milliseconds after upAt.
	require.True(t, after.Before(upAt.Add(time.Second)) && after.After(upAt.Add(-time.Second)),
		"first tick after the outage %v: want the latest tick missed before the restart at %v", after, upAt)
	// The first tick: no later than 1 s after the first replica started.
	require.True(t, ticks[0].Before(phase1.Add(2*time.Second)), "first tick %v, replicas started %v", ticks[0], phase1)
	// The last: the one replica of phase 2 ran until about upAt+2.5 s.
	require.True(t, ticks[len(ticks)-1].After(upAt.Add(time.Second)), "last tick %v", ticks[len(ticks)-1])

	// The restarted replica said what it skipped.
	skippedWant := int(after.Sub(before)/time.Second) - 1
	var skipped []int
	var took, alone []time.Duration // alone: the phase-2 replica, the only one running
	for i, l := range logs {
		f, err := os.Open(l)
		require.NoError(t, err)
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var line struct {
				Msg     string `json:"msg"`
				Skipped int    `json:"skipped"`
				Took    int64  `json:"took"`
			}
			if json.Unmarshal(sc.Bytes(), &line) != nil {
				continue
			}
			if strings.Contains(line.Msg, "were skipped") {
				skipped = append(skipped, line.Skipped)
			}
			if line.Took > 0 {
				took = append(took, time.Duration(line.Took))
				if i == len(logs)-1 {
					alone = append(alone, time.Duration(line.Took))
				}
			}
		}
		f.Close()
	}
	require.Equal(t, []int{skippedWant}, skipped, "skip warnings (logs in %s)", filepath.Dir(logs[0]))
	slices.Sort(took)
	slices.Sort(alone)
	// The baseline: a transaction with one ferry.Enqueue, on the same
	// database, measured here (the replicas are gone).
	var plain []time.Duration
	for range 20 {
		t0 := time.Now()
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := ferry.Enqueue(ctx, tx, "report.plain", tickArgs{Report: "daily"})
			return err
		}))
		plain = append(plain, time.Since(t0))
	}
	slices.Sort(plain)
	if len(took) > 0 && len(alone) > 0 {
		t.Logf("%d ticks enqueued once each across 3 replicas, %d SIGKILLs, %d ticks skipped during the outage; "+
			"tick transaction (begin, lock, update, outbox insert, commit): median %v, max %v over %d ticks "+
			"(one replica alone: median %v over %d); a plain Enqueue transaction: median %v",
			len(ticks), kills, skippedWant, took[len(took)/2], took[len(took)-1], len(took),
			alone[len(alone)/2], len(alone), plain[len(plain)/2])
	}
}
