package dlq_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/dlq"
)

func dead(id, appID, reason string, first, at time.Time) broker.DeadMessage {
	h := map[string]string{}
	if appID != "" {
		h[broker.HeaderAppID] = appID
	}
	return broker.DeadMessage{Message: &broker.Message{ID: id, Headers: h}, LastError: reason, FirstFailedAt: first, DeadAt: at}
}

func TestMatchAndGroup(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	msgs := []broker.DeadMessage{
		dead("1", "a", "SMTP 550 mailbox unavailable", t0, t0.Add(time.Minute)),
		dead("2", "b", "timeout", time.Time{}, t0.Add(2*time.Minute)),
		dead("3", "c", "SMTP 550 mailbox unavailable", t0.Add(-time.Hour), t0.Add(3*time.Minute)),
		dead("4", "", "", time.Time{}, time.Time{}),
	}
	require.Equal(t, msgs, dlq.Match(msgs, dlq.Filter{}))
	require.Equal(t, []string{"1", "3"}, dlq.IDs(dlq.Match(msgs, dlq.Filter{ErrorContains: "smtp 550"})))
	require.Equal(t, []string{"2"}, dlq.IDs(dlq.Match(msgs, dlq.Filter{AppIDs: []string{"b", "zz"}})))
	require.Equal(t, []string{"4"}, dlq.IDs(dlq.Match(msgs, dlq.Filter{HasReason: true})), "the group of an empty reason")
	require.Empty(t, dlq.Match(msgs, dlq.Filter{ErrorContains: "smtp", AppIDs: []string{"b"}}), "filters combine")

	g := dlq.GroupByReason(msgs)
	require.Len(t, g, 3)
	require.Equal(t, "SMTP 550 mailbox unavailable", g[0].Reason)
	require.Equal(t, 2, g[0].Count)
	require.Equal(t, t0.Add(-time.Hour), g[0].FirstSeen)
	require.Equal(t, t0.Add(3*time.Minute), g[0].LastSeen)
	require.Equal(t, "1", g[0].Sample.Message.ID, "the oldest is the sample")
	require.Equal(t, "timeout", g[1].Reason, "ties: seen last first")
	require.Equal(t, t0.Add(2*time.Minute), g[1].FirstSeen, "never retried: first failed when dead-lettered")
	total := 0
	for _, x := range g {
		total += x.Count
	}
	require.Equal(t, len(msgs), total, "every message in one group")

	require.Equal(t, []string{"9"}, dlq.Missing([]string{"1", "9"}, []string{"1"}))
	require.Equal(t, []string{"3"}, dlq.IDs(dlq.Pick(msgs, []string{"3"})))
	require.Len(t, dlq.Pick(msgs, nil), 4)
}

// TestGroupByCause: the same failure of many messages, with their own ids
// and times in the text, is one group, and selecting that group (as the
// console's "replay group" does) selects all of them and no other.
func TestGroupByCause(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var msgs []broker.DeadMessage
	for i := range 968 {
		msgs = append(msgs, dead(fmt.Sprint(i), fmt.Sprint(i), fmt.Sprintf("app: notification %d: smtp 127.0.0.1:1025: dial tcp 127.0.0.1:1025: connect: connection refused", i+1), t0, t0.Add(time.Duration(i)*time.Millisecond)))
	}
	msgs = append(msgs, dead("x", "x", "app: notification 5: smtp 127.0.0.1:1025: 550 5.1.1 mailbox unavailable", t0, t0))
	g := dlq.GroupByReason(msgs)
	require.Len(t, g, 2)
	require.Equal(t, 968, g[0].Count)
	require.Equal(t, "app: notification N: smtp <addr>: dial tcp <addr>: connect: connection refused", g[0].Reason)
	require.Equal(t, "0", g[0].Sample.Message.ID)
	require.Len(t, dlq.Match(msgs, dlq.Filter{Reason: g[0].Reason}), 968)
	require.Len(t, dlq.Match(msgs, dlq.Filter{Reason: msgs[7].LastError}), 968, "a last error as it is selects its cause's group")
	require.Equal(t, []string{"x"}, dlq.IDs(dlq.Match(msgs, dlq.Filter{Reason: g[1].Reason})))
}
