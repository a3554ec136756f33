package ferrycli

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/internal/testenv"
)

// stallingSMTP is a loopback SMTP server that takes every mail in full and
// never answers the end of its data: a mail server that scans slowly.
type stallingSMTP struct {
	addr  string
	mails atomic.Int32
	mu    sync.Mutex
	conns []net.Conn
}

func startStallingSMTP(t *testing.T) *stallingSMTP {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &stallingSMTP{addr: l.Addr().String()}
	t.Cleanup(func() { l.Close(); s.cut() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			go s.serve(c)
		}
	}()
	return s
}

// cut closes every connection, as the exit of the ferry process would.
func (s *stallingSMTP) cut() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.Close()
	}
}

func (s *stallingSMTP) serve(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	reply := func(s string) { c.Write([]byte(s + "\r\n")) } //nolint:errcheck
	reply("220 stalling.test ESMTP")
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		switch strings.ToUpper(strings.Fields(line + " x")[0]) {
		case "EHLO", "HELO":
			reply("250 stalling.test")
		case "DATA":
			reply("354 go ahead")
			for {
				l, err := r.ReadString('\n')
				if err != nil {
					return
				}
				if l == ".\r\n" {
					break
				}
			}
			s.mails.Add(1)
			_, _ = io.Copy(io.Discard, r) // never answers; waits for the client to go
			return
		default:
			reply("250 ok")
		}
	}
}

// TestShutdownTimeoutKeepsItsWord: "ferry run --shutdown-timeout 3s" with
// three mails waiting on an SMTP server that never answers the end of
// their data returns within the timeout plus ShutdownMargin after the stop
// signal (main then exits), with exit code 0, and leaves the three
// notifications for redelivery: a new worker with a prompt SMTP server
// sends them. The bound is the documented contract, with the margin it
// documents; it is not a performance figure.
func TestShutdownTimeoutKeepsItsWord(t *testing.T) {
	testenv.RequireTCP(t, "rabbitmq", testenv.HostPort(testenv.RabbitMQURL()))
	db := testenv.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var errOut bytes.Buffer
	require.Equal(t, 0, Main(ctx, []string{"ferry", "migrate", "--database-url", db}, io.Discard, &errOut), errOut.String())

	slow := startStallingSMTP(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	common := []string{"--database-url", db, "--broker", "rabbitmq", "--rabbitmq-url", testenv.RabbitMQURL(),
		"--exchange", testenv.UniqueName("sd-ex"), "--queue", testenv.UniqueName("sd-q"), "--log-level", "error"}
	const timeout = 3 * time.Second
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan int, 1)
	go func() {
		done <- Main(runCtx, append([]string{"ferry", "run", "--addr", addr, "--smtp-addr", slow.addr,
			"--smtp-data-timeout", "1m", "--shutdown-timeout", timeout.String()}, common...), io.Discard, io.Discard)
	}()
	require.Eventually(t, func() bool {
		res, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	}, 30*time.Second, 50*time.Millisecond)
	for i := range 3 {
		body := fmt.Sprintf(`{"user_id":"u%d","channel":"email","to":"u%d@example.com","subject":"s","body":"b"}`, i, i)
		res, err := http.Post("http://"+addr+"/notifications", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		res.Body.Close()
		require.Equal(t, http.StatusCreated, res.StatusCode)
	}
	require.Eventually(t, func() bool { return slow.mails.Load() == 3 }, 30*time.Second, 20*time.Millisecond,
		"the three mails reach the SMTP server, which does not answer")

	begin := time.Now()
	stop() // SIGTERM
	var code int
	select {
	case code = <-done:
	case <-time.After(time.Minute):
		t.Fatal("ferry run did not return a minute after the stop signal")
	}
	took := time.Since(begin)
	require.Less(t, took, timeout+ShutdownMargin, "ferry run returns within --shutdown-timeout + ShutdownMargin")
	require.GreaterOrEqual(t, took, timeout, "in-flight work gets the whole --shutdown-timeout")
	require.Equal(t, 0, code)
	t.Logf("returned %v after the stop signal (--shutdown-timeout %v, margin %v)", took.Round(time.Millisecond), timeout, ShutdownMargin)

	pool, err := pgxpool.New(ctx, db)
	require.NoError(t, err)
	defer pool.Close()
	statuses := func() map[string]int {
		rows, err := pool.Query(ctx, `SELECT status, count(*) FROM notifications GROUP BY status`)
		require.NoError(t, err)
		m := map[string]int{}
		for rows.Next() {
			var s string
			var n int
			require.NoError(t, rows.Scan(&s, &n))
			m[s] = n
		}
		require.NoError(t, rows.Err())
		return m
	}
	require.Equal(t, map[string]int{"pending": 3}, statuses(), "nothing was marked sent without the server's answer")

	// The process exit cuts what it abandoned; a new worker gets the three
	// messages again and sends them through a server that answers.
	slow.cut()
	wctx, wstop := context.WithCancel(ctx)
	wdone := make(chan int, 1)
	go func() {
		wdone <- Main(wctx, append([]string{"ferry", "worker", "--smtp-addr", testenv.SMTPAddr(), "--metrics-addr", "",
			"--shutdown-timeout", "5s"}, common...), io.Discard, io.Discard)
	}()
	defer func() { wstop(); <-wdone }()
	require.Eventually(t, func() bool { return statuses()["sent"] == 3 }, 60*time.Second, 100*time.Millisecond,
		"the unsettled messages were redelivered and sent")
}
