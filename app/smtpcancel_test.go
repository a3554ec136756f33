package app_test

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/app"
	"github.com/ferrymq/ferry/worker"
)

// slowSMTP is a loopback SMTP server that accepts every mail but can stall
// at chosen points, to see what the handler does when its ctx is cancelled
// meanwhile (a worker shutting down with a slow mail server).
type slowSMTP struct {
	addr string
	// mail receives once per MAIL command; with stallMail the server then
	// never answers it.
	mail chan struct{}
	// data receives once the whole mail (up to the lone ".") is in; the
	// server answers "250" only after release is closed.
	data    chan struct{}
	release chan struct{}
	// cut receives the command the server was stalling on (or "after
	// 250" when it was waiting for the next command) when the client
	// closed the connection.
	cut chan string
	// dataDelay is how long the server takes, after release, to answer
	// the end of the data (a server scanning the mail).
	dataDelay time.Duration
	// mails counts the mails received in full (each would be delivered
	// once the answer is 250).
	mails atomic.Int32
}

func newSlowSMTP(t *testing.T, stallMail, stallQuit bool) *slowSMTP {
	return startSlowSMTP(t, stallMail, stallQuit, 0)
}

// newSlowDataSMTP is a server that answers every command at once but the
// end of the mail data only after delay.
func newSlowDataSMTP(t *testing.T, delay time.Duration) *slowSMTP {
	s := startSlowSMTP(t, false, false, delay)
	close(s.release)
	return s
}

func startSlowSMTP(t *testing.T, stallMail, stallQuit bool, dataDelay time.Duration) *slowSMTP {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	s := &slowSMTP{addr: l.Addr().String(), mail: make(chan struct{}, 8), data: make(chan struct{}, 8),
		release: make(chan struct{}), cut: make(chan string, 8), dataDelay: dataDelay}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go s.serve(c, stallMail, stallQuit)
		}
	}()
	return s
}

func (s *slowSMTP) serve(c net.Conn, stallMail, stallQuit bool) {
	defer c.Close()
	r := bufio.NewReader(c)
	reply := func(s string) { c.Write([]byte(s + "\r\n")) } //nolint:errcheck
	// stall reads until the client closes the connection, never answering.
	stall := func(phase string) {
		for {
			if _, err := r.ReadByte(); err != nil {
				s.cut <- phase
				return
			}
		}
	}
	reply("220 slow.test ESMTP")
	answeredData := false
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			if answeredData {
				s.cut <- "after 250"
			}
			return
		}
		switch verb := strings.ToUpper(strings.Fields(line + " x")[0]); verb {
		case "EHLO", "HELO":
			reply("250 slow.test")
		case "MAIL":
			s.mail <- struct{}{}
			if stallMail {
				stall("MAIL")
				return
			}
			reply("250 2.1.0 ok")
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
			s.data <- struct{}{}
			<-s.release
			time.Sleep(s.dataDelay)
			reply("250 2.0.0 queued as 42")
			answeredData = true
		case "QUIT":
			if stallQuit {
				stall("QUIT")
				return
			}
			reply("221 bye")
			return
		default:
			reply("250 ok")
		}
	}
}

// awaitServer waits until the fake server signals on ch (it got the mail,
// or a MAIL command), failing the test if the handler returned first or
// nothing came within 20 s.
func awaitServer(t *testing.T, ch <-chan struct{}, done <-chan error, what string) {
	t.Helper()
	select {
	case <-ch:
	case err := <-done:
		t.Fatalf("the handler returned before sending: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal(what)
	}
}

// handle runs HandleNotification with ctx in its own transaction, committed
// with a fresh context as the worker does for a nil result, and returns the
// handler's error on the channel.
func (b *bundle) handle(ctx context.Context, id string, t *testing.T) <-chan error {
	msg := b.outboxMessage(t, id)
	done := make(chan error, 1)
	go func() {
		done <- b.inTx(func(tx pgx.Tx) error { return b.app.HandleNotification(ctx, tx, msg) })
	}()
	return done
}

// The review's double send: a slow SMTP server, the worker shutting down.
// The server has the whole mail when ctx is cancelled. The row must
// already be marked sent in the open transaction (only the commit is
// left), the handler must wait for the server's answer instead of cutting
// the dialogue, return nil although ctx is done, and not wait for the
// server's QUIT answer either (SMTPTimeout is far away).
func TestHandleNotificationCancelledWhileServerAccepts(t *testing.T) {
	t.Parallel()
	srv := newSlowSMTP(t, false, true)
	b := setup(t, app.Config{SMTPAddr: srv.addr, SMTPTimeout: time.Minute})
	id := b.create(t, valid())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := b.handle(ctx, id, t)

	awaitServer(t, srv.data, done, "the mail never reached the server")
	// While the server holds the mail, the handler's transaction has
	// already run its UPDATE: after the accept only COMMIT remains.
	var queries []string
	rows, err := b.pool.Query(context.Background(), `
		SELECT query FROM pg_stat_activity
		WHERE datname = current_database() AND state = 'idle in transaction'`)
	require.NoError(t, err)
	queries, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, queries, 1, "the handler's open transaction")
	require.Contains(t, queries[0], "status = 'sent'", "the last statement before the send is the mark")

	cancel()                           // SIGTERM: the worker cancels the handler's ctx
	time.Sleep(100 * time.Millisecond) // let the cancellation land while the server decides
	close(srv.release)
	select {
	case err := <-done:
		require.NoError(t, err, "the server accepted the mail: it is sent")
	case <-time.After(20 * time.Second):
		t.Fatal("the handler waited for the stalled QUIT instead of honouring its cancelled ctx")
	}
	require.Equal(t, "after 250", <-srv.cut, "the client hung up right after the accept")
	n, err := b.app.Status(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, app.StatusSent, n.Status)
	require.Equal(t, 1, n.Attempts)

	// The redelivery after the shutdown sends nothing.
	<-srv.mail // the first send's
	msg := b.outboxMessage(t, id)
	require.NoError(t, b.inTx(func(tx pgx.Tx) error { return b.app.HandleNotification(context.Background(), tx, msg) }))
	select {
	case <-srv.mail:
		t.Fatal("the redelivery sent the mail again")
	default:
	}
}

// A shutdown while the server stalls before it has the mail cuts the
// dialogue at once (not after SMTPTimeout), reports the cancellation (a
// retry, not a DLQ), and leaves the notification pending.
func TestHandleNotificationCancelledBeforeAccept(t *testing.T) {
	t.Parallel()
	srv := newSlowSMTP(t, true, false)
	b := setup(t, app.Config{SMTPAddr: srv.addr, SMTPTimeout: time.Minute})
	id := b.create(t, valid())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := b.handle(ctx, id, t)
	awaitServer(t, srv.mail, done, "the handler never reached MAIL FROM")
	cancel()
	select {
	case err := <-done:
		require.Error(t, err)
		require.True(t, errors.Is(err, context.Canceled), "the error says the send was cancelled: %v", err)
		require.False(t, worker.IsPermanent(err), "%v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the handler ignored its cancelled ctx and waited for the SMTP timeout")
	}
	require.Equal(t, "MAIL", <-srv.cut)
	n, err := b.app.Status(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, app.StatusPending, n.Status, "the mark was rolled back with the failed send")
	require.Equal(t, 0, n.Attempts)
}
