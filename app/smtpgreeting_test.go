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

// greetingSMTP serves loopback SMTP that answers the connection with
// greeting and both EHLO and HELO with helo (when greeting is a 220), to
// see how the handler classifies a refusal before any mail command.
func greetingSMTP(t *testing.T, greeting, helo string) string {
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
				reply(greeting)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					switch strings.ToUpper(strings.Fields(line + " x")[0]) {
					case "EHLO", "HELO":
						reply(helo)
					case "QUIT":
						reply("221 bye")
						return
					default:
						reply("503 5.5.1 bad sequence")
					}
				}
			}(c)
		}
	}()
	return l.Addr().String()
}

// An SMTP 5xx at the greeting or to EHLO/HELO is permanent, as app/doc.go
// says of every 5xx (RFC 5321 section 4.2.1: 5yz is a permanent negative
// completion reply); a 4xx there (421 service not available) is retried.
func TestHandleNotificationSMTPGreetingRefusal(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, greeting, helo string
		permanent            bool
	}{
		{"Greeting554", "554 5.3.2 no SMTP service here", "", true},
		{"Ehlo550", "220 refusing.test ESMTP", "550 5.7.1 you are not welcome", true},
		{"Greeting421", "421 4.3.2 service not available, closing", "", false},
		{"Ehlo421", "220 refusing.test ESMTP", "421 4.3.2 shutting down", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := setup(t, app.Config{SMTPAddr: greetingSMTP(t, tc.greeting, tc.helo)})
			id := b.create(t, valid())
			msg := b.outboxMessage(t, id)
			err := b.inTx(func(tx pgx.Tx) error { return b.app.HandleNotification(context.Background(), tx, msg) })
			require.Error(t, err)
			require.Equal(t, tc.permanent, worker.IsPermanent(err), "%v", err)
			n, err := b.app.Status(context.Background(), id)
			require.NoError(t, err)
			require.Equal(t, app.StatusPending, n.Status)
		})
	}
}
