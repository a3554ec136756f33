package app_test

import (
	"bufio"
	"context"
	"net"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/app"
	"github.com/ferrymq/ferry/worker"
)

// refusingSMTP serves a minimal SMTP dialogue on loopback that answers
// every RCPT TO with rcptReply (e.g. "550 5.1.1 no such user"), to see how
// the handler classifies a server's refusal. It returns the address.
func refusingSMTP(t *testing.T, rcptReply string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				r := bufio.NewReader(c)
				reply := func(s string) { c.Write([]byte(s + "\r\n")) } //nolint:errcheck
				reply("220 refusing.test ESMTP")
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					switch verb := strings.ToUpper(strings.Fields(line + " x")[0]); verb {
					case "EHLO", "HELO":
						reply("250 refusing.test")
					case "RCPT":
						reply(rcptReply)
					case "DATA":
						reply("503 5.5.1 no valid recipients")
					case "QUIT":
						reply("221 bye")
						return
					default:
						reply("250 ok")
					}
				}
			}(c)
		}
	}()
	return l.Addr().String()
}

// A 5xx refusal cannot succeed on retry: the handler makes it permanent
// (straight to the DLQ). A 4xx one is retried.
func TestHandleNotificationSMTPRefusal(t *testing.T) {
	t.Parallel()
	for reply, permanent := range map[string]bool{
		"550 5.1.1 no such user here": true,
		"451 4.3.0 try again later":   false,
	} {
		b := setup(t, app.Config{SMTPAddr: refusingSMTP(t, reply)})
		id := b.create(t, valid())
		msg := b.outboxMessage(t, id)
		err := b.inTx(func(tx pgx.Tx) error { return b.app.HandleNotification(context.Background(), tx, msg) })
		require.Error(t, err, reply)
		require.Equal(t, permanent, worker.IsPermanent(err), "%s: %v", reply, err)
		require.Contains(t, err.Error(), reply[4:], "the reason names the server's answer")
		n, err := b.app.Status(context.Background(), id)
		require.NoError(t, err)
		require.Equal(t, app.StatusPending, n.Status)
	}
}
