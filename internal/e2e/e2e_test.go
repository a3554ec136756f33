package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// TestBrokerOutage is issue 2's test 3: with the broker stopped, 200
// notifications are accepted by the API and wait in the outbox; once the
// broker is back, the outbox drains to 0 and 200 distinct mails reach
// Mailpit.
//
// With the WAL relay (--relay-mode=wal) the relay streams first, then the
// broker stops: the stream stops, the slot keeps the WAL and the events
// wait as outbox rows; once the broker is back the stream resumes.
func TestBrokerOutage(t *testing.T) {
	forEachBrokerAndMode(t, func(t *testing.T, b, mode string) {
		s := newStack(t, b)
		s.relayMode = mode
		service := brokerServers[b].service
		var base string
		if mode == outbox.RelayModeWAL {
			_, base = s.run("300ms", "--smtp-addr", testenv.SMTPAddr())
			waitFor(t, time.Minute, "the WAL relay to stream", func() (bool, string) {
				n, raw := s.outboxStats()
				return n == 0 && strings.Contains(raw, `"active": true`), raw
			})
		}
		testenv.Services(t, "stop", service)
		started := false
		t.Cleanup(func() {
			if !started {
				testenv.Services(t, "start", service)
			}
		})

		if mode != outbox.RelayModeWAL {
			_, base = s.run("300ms", "--smtp-addr", testenv.SMTPAddr())
		}
		ids := s.post(base, 200)
		require.Len(t, ids, 200)
		unprocessed, raw := s.outboxStats()
		require.EqualValues(t, 200, unprocessed, "with the broker down nothing can be published: %s", raw)

		testenv.Services(t, "start", service)
		started = true

		waitFor(t, 2*time.Minute, "the outbox to drain", func() (bool, string) {
			n, raw := s.outboxStats()
			return n == 0, raw
		})
		waitFor(t, 2*time.Minute, "200 distinct mails in Mailpit", func() (bool, string) {
			distinct, total := mailpitMessageIDs(t, s.tag)
			return len(distinct) == 200, fmt.Sprintf("%d distinct of %d mails", len(distinct), total)
		})
		for _, id := range []string{ids[0], ids[199]} {
			require.Equal(t, "sent", notification(t, base, id)["status"])
		}
	})
}

// TestDeadLetterAndReplay is issue 2's tests 4 and 9: with SMTP pointed
// where nothing listens, a notification is attempted exactly 5 times,
// spaced by the retry delay, then parked in the DLQ with its last error
// (seen through RabbitMQ's management API and `ferry dlq list`) and marked
// dead; with SMTP fixed, `ferry dlq replay` brings it back and it is sent.
func TestDeadLetterAndReplay(t *testing.T) {
	forEachBrokerAndMode(t, func(t *testing.T, b, mode string) {
		const delay = 300 * time.Millisecond
		s := newStack(t, b)
		s.relayMode = mode
		nowhere := freeAddr(t) // nothing listens there once the listener closed
		p, base := s.run(delay.String(), "--smtp-addr", nowhere, "--max-attempts", "5")
		ids := s.post(base, 1)
		id := ids[0]

		waitFor(t, time.Minute, "the notification to be dead", func() (bool, string) {
			n := notification(t, base, id)
			return n["status"] == "dead", fmt.Sprint(n)
		})
		n := notification(t, base, id)
		require.EqualValues(t, 5, n["attempts"], "exactly 5 attempts: %v", n)
		require.Contains(t, n["last_error"], nowhere)

		dlqArgs := append([]string{"dlq", "list", "--format", "json"}, s.dlqArgs()...)
		var dead []struct {
			ID            string     `json:"id"`
			Type          string     `json:"type"`
			Attempts      int        `json:"attempts"`
			LastError     string     `json:"last_error"`
			FirstFailedAt *time.Time `json:"first_failed_at"`
			DeadAt        *time.Time `json:"dead_at"`
		}
		waitFor(t, 30*time.Second, "the message in `ferry dlq list`", func() (bool, string) {
			code, out, errOut := ferry(t, dlqArgs...)
			if code != 0 {
				return false, errOut
			}
			dead = nil
			require.NoError(t, json.Unmarshal([]byte(out), &dead), out)
			return len(dead) == 1, out
		})
		d := dead[0]
		require.Equal(t, "notification.requested", d.Type)
		require.Equal(t, 5, d.Attempts)
		require.Contains(t, d.LastError, nowhere)
		require.NotNil(t, d.FirstFailedAt)
		require.NotNil(t, d.DeadAt)
		// Attempts 1..5 are separated by 4 retry delays: the first failure
		// is attempt 1, the move to the DLQ follows attempt 5.
		require.GreaterOrEqual(t, d.DeadAt.Sub(*d.FirstFailedAt), 4*delay-50*time.Millisecond,
			"5 attempts spaced by %v: first failed %v, dead %v", delay, d.FirstFailedAt, d.DeadAt)

		code, out, _ := ferry(t, append([]string{"dlq", "list"}, s.dlqArgs()...)...)
		require.Equal(t, 0, code)
		require.Contains(t, out, d.ID)
		require.Contains(t, out, "1 dead message(s)")

		if b == "rabbitmq" {
			requireRabbitDLQ(t, broker.DLQName(s.queue), d.ID, nowhere)
		}

		// A second dead message is purged: refused without --yes, deleted with it.
		id2 := s.post(base, 1)[0]
		waitFor(t, time.Minute, "the second notification to be dead", func() (bool, string) {
			n := notification(t, base, id2)
			return n["status"] == "dead", fmt.Sprint(n)
		})
		var id2Msg string
		waitFor(t, 30*time.Second, "two messages in `ferry dlq list`", func() (bool, string) {
			code, out, errOut := ferry(t, dlqArgs...)
			if code != 0 {
				return false, errOut
			}
			dead = nil
			require.NoError(t, json.Unmarshal([]byte(out), &dead), out)
			for _, m := range dead {
				if m.ID != d.ID {
					id2Msg = m.ID
				}
			}
			return len(dead) == 2, out
		})
		purge := append([]string{"dlq", "purge", "--id", id2Msg}, s.dlqArgs()...)
		code, _, errOut := ferry(t, purge...)
		require.Equal(t, 2, code)
		require.Contains(t, errOut, "add --yes")
		code, out, errOut = ferry(t, append(purge, "--yes")...)
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "purged 1 message(s)")
		require.Contains(t, errOut, "dlq purge")
		code, out, _ = ferry(t, append([]string{"dlq", "list"}, s.dlqArgs()...)...)
		require.Equal(t, 0, code)
		require.Contains(t, out, "1 dead message(s)")
		require.NotContains(t, out, "\n"+id2Msg+" ")

		// Fix SMTP: stop the run with the bad address, start one with Mailpit.
		require.Equal(t, 0, p.stop(t), "ferry run stops gracefully with exit 0")
		_, base = s.run(delay.String(), "--smtp-addr", testenv.SMTPAddr())

		code, out, errOut = ferry(t, append([]string{"dlq", "replay", "--id", d.ID, "--dry-run"}, s.dlqArgs()...)...)
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "would replay 1 message(s)")
		require.Equal(t, "dead", notification(t, base, id)["status"], "a dry run moves nothing")

		code, out, errOut = ferry(t, append([]string{"dlq", "replay", "--id", d.ID}, s.dlqArgs()...)...)
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "replayed 1 message(s)")
		require.Contains(t, errOut, "dlq replay")
		require.Contains(t, errOut, "by=")
		require.Contains(t, errOut, "id="+d.ID)

		waitFor(t, time.Minute, "the replayed notification to be sent", func() (bool, string) {
			n := notification(t, base, id)
			return n["status"] == "sent", fmt.Sprint(n)
		})
		waitFor(t, 30*time.Second, "its mail in Mailpit", func() (bool, string) {
			distinct, total := mailpitMessageIDs(t, s.tag)
			return len(distinct) == 1, fmt.Sprintf("%d distinct of %d", len(distinct), total)
		})
		code, out, _ = ferry(t, append([]string{"dlq", "list"}, s.dlqArgs()...)...)
		require.Equal(t, 0, code)
		require.Contains(t, out, "0 dead message(s)")
	})
}

// requireRabbitDLQ checks through the RabbitMQ management HTTP API that
// the DLQ holds exactly one message, id, whose x-last-error names the SMTP
// address.
func requireRabbitDLQ(t *testing.T, dlq, id, smtpAddr string) {
	t.Helper()
	mgmt := testenv.RabbitMQManagementURL()
	qURL := mgmt + "/api/queues/%2F/" + url.PathEscape(dlq)
	// The management API refreshes queue statistics every few seconds.
	waitFor(t, 30*time.Second, "messages=1 on "+dlq+" in the management API", func() (bool, string) {
		resp, err := http.Get(qURL)
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		var q struct {
			Messages *int `json:"messages"`
		}
		body, _ := io.ReadAll(resp.Body)
		if json.Unmarshal(body, &q) != nil || q.Messages == nil {
			return false, string(body)
		}
		return *q.Messages == 1, string(body)
	})
	req := `{"count":5,"ackmode":"ack_requeue_true","encoding":"auto"}`
	resp, err := http.Post(qURL+"/get", "application/json", strings.NewReader(req))
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	var msgs []struct {
		Properties struct {
			MessageID string         `json:"message_id"`
			Headers   map[string]any `json:"headers"`
		} `json:"properties"`
	}
	require.NoError(t, json.Unmarshal(body, &msgs), string(body))
	require.Len(t, msgs, 1, string(body))
	require.Equal(t, id, msgs[0].Properties.MessageID)
	lastErr, _ := msgs[0].Properties.Headers[broker.HeaderLastError].(string)
	require.Contains(t, lastErr, smtpAddr, "x-last-error: %s", body)
}

// TestDLQListReplayPurge is issue 4's DLQ round on every broker: three
// messages dead-lettered, listed, one replayed (then delivered), and the
// other two purged with --all.
func TestDLQListReplayPurge(t *testing.T) {
	forEachBroker(t, func(t *testing.T, b string) {
		const delay = 200 * time.Millisecond
		s := newStack(t, b)
		p, base := s.run(delay.String(), "--smtp-addr", freeAddr(t), "--max-attempts", "2")
		ids := s.post(base, 3)
		for _, id := range ids {
			waitFor(t, time.Minute, "notification "+id+" to be dead", func() (bool, string) {
				n := notification(t, base, id)
				return n["status"] == "dead", fmt.Sprint(n)
			})
		}
		list := append([]string{"dlq", "list", "--format", "json"}, s.dlqArgs()...)
		var dead []struct {
			ID       string `json:"id"`
			Attempts int    `json:"attempts"`
		}
		waitFor(t, 30*time.Second, "three messages in `ferry dlq list`", func() (bool, string) {
			code, out, errOut := ferry(t, list...)
			if code != 0 {
				return false, errOut
			}
			dead = nil
			require.NoError(t, json.Unmarshal([]byte(out), &dead), out)
			return len(dead) == 3, out
		})
		for _, d := range dead {
			require.Equal(t, 2, d.Attempts, "each was tried --max-attempts times")
		}

		// Mail works again; replay one.
		require.Equal(t, 0, p.stop(t))
		_, base = s.run(delay.String(), "--smtp-addr", testenv.SMTPAddr(), "--max-attempts", "2")
		code, out, errOut := ferry(t, append([]string{"dlq", "replay", "--id", dead[0].ID}, s.dlqArgs()...)...)
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "replayed 1 message(s)")
		waitFor(t, 30*time.Second, "the replayed message's mail in Mailpit", func() (bool, string) {
			distinct, total := mailpitMessageIDs(t, s.tag)
			return len(distinct) == 1, fmt.Sprintf("%d distinct of %d", len(distinct), total)
		})
		sent := 0
		for _, id := range ids {
			if notification(t, base, id)["status"] == "sent" {
				sent++
			}
		}
		require.Equal(t, 1, sent, "exactly the replayed notification is sent")

		// Purge the other two.
		code, out, errOut = ferry(t, append([]string{"dlq", "purge", "--all", "--yes"}, s.dlqArgs()...)...)
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "purged 2 message(s)")
		code, out, _ = ferry(t, append([]string{"dlq", "list"}, s.dlqArgs()...)...)
		require.Equal(t, 0, code)
		require.Contains(t, out, "0 dead message(s)")
	})
}
