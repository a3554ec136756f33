// Package dlq holds what an operator does with a dead-letter queue, the
// same on every broker, for the ferry command (ferry dlq list|replay|purge)
// and the web console (package console): filter and group the dead
// messages of a broker.DeadLetterQueue, and replay or purge them with an
// audit line per message (who, when, what).
//
// It reads and acts only through broker.DeadLetterQueue (see
// broker.Broker.DLQ); it knows no adapter. Replay is at-least-once like the
// rest of ferry: a replayed message is stored in the work queue before it
// leaves the DLQ (broker.DeadLetterQueue.Replay), so a failure in between
// leaves it in both, and the idempotent consumer drops the duplicate.
package dlq

import (
	"context"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/ferrymq/ferry/broker"
)

// Filter selects dead messages; the zero Filter selects all.
type Filter struct {
	// ErrorContains keeps the messages whose last error contains this
	// text, compared case-insensitively; empty keeps all.
	ErrorContains string
	// AppIDs keeps the messages whose application id (the header
	// broker.HeaderAppID) is one of these; empty keeps all.
	AppIDs []string
	// Reason keeps the messages whose last error has this cause (Cause:
	// a group of GroupByReason; a last error as it is selects its cause's
	// group too); empty keeps all. Set HasReason to select the group of
	// messages with an empty last error.
	Reason    string
	HasReason bool
}

// Empty reports whether f selects every message.
func (f Filter) Empty() bool {
	return f.ErrorContains == "" && len(f.AppIDs) == 0 && f.Reason == "" && !f.HasReason
}

// Match returns the messages of msgs that f selects, in their order.
func Match(msgs []broker.DeadMessage, f Filter) []broker.DeadMessage {
	if f.Empty() {
		return msgs
	}
	text := strings.ToLower(f.ErrorContains)
	cause := Cause(f.Reason)
	ids := map[string]bool{}
	for _, id := range f.AppIDs {
		ids[id] = true
	}
	var out []broker.DeadMessage
	for _, m := range msgs {
		if text != "" && !strings.Contains(strings.ToLower(m.LastError), text) {
			continue
		}
		if len(ids) > 0 && !ids[AppID(m)] {
			continue
		}
		if (f.Reason != "" || f.HasReason) && Cause(m.LastError) != cause {
			continue
		}
		out = append(out, m)
	}
	return out
}

// AppID is m's application id (the header broker.HeaderAppID), "" when it
// has none.
func AppID(m broker.DeadMessage) string {
	if m.Message == nil {
		return ""
	}
	return m.Message.Headers[broker.HeaderAppID]
}

// FirstFailed is when m's first attempt failed: broker.HeaderFirstFailedAt,
// which the adapters set on the first retry, or, for a message
// dead-lettered at its first failure (a permanent error, an invalid event:
// it was never retried, and some adapters then set no such header), the
// time it was dead-lettered, which is when that one attempt failed. Zero
// when the DLQ knows neither.
func FirstFailed(m broker.DeadMessage) time.Time {
	if !m.FirstFailedAt.IsZero() {
		return m.FirstFailedAt
	}
	return m.DeadAt
}

// Group is the dead messages of one DLQ whose last errors have the same
// cause (Cause).
type Group struct {
	// Reason is the cause they share: Cause of their last error
	// (broker.HeaderLastError), e.g. "app: notification N: smtp <addr>:
	// ... connection refused"; Sample.LastError is one of them as it is.
	Reason string
	// Count is the number of messages in the group.
	Count int
	// FirstSeen is the earliest first failure (FirstFailed) in the
	// group, LastSeen the latest time a message of it was dead-lettered
	// (DeadMessage.DeadAt, or FirstFailed when the DLQ does not record
	// it); zero when the DLQ knows neither.
	FirstSeen, LastSeen time.Time
	// Sample is the group's oldest message (the DLQ lists oldest first).
	Sample broker.DeadMessage
}

// GroupByReason groups msgs by the cause of their last error (Cause: the
// same failure with other ids, addresses, numbers or times is one group),
// the largest group first (ties: the one seen last first, then by reason).
func GroupByReason(msgs []broker.DeadMessage) []Group {
	byReason := map[string]*Group{}
	var order []*Group
	for _, m := range msgs {
		cause := Cause(m.LastError)
		g := byReason[cause]
		if g == nil {
			g = &Group{Reason: cause, Sample: m}
			byReason[cause] = g
			order = append(order, g)
		}
		g.Count++
		first, last := FirstFailed(m), m.DeadAt
		if last.IsZero() {
			last = first
		}
		if !first.IsZero() && (g.FirstSeen.IsZero() || first.Before(g.FirstSeen)) {
			g.FirstSeen = first
		}
		if last.After(g.LastSeen) {
			g.LastSeen = last
		}
	}
	out := make([]Group, 0, len(order))
	for _, g := range order {
		out = append(out, *g)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		if !out[i].LastSeen.Equal(out[j].LastSeen) {
			return out[i].LastSeen.After(out[j].LastSeen)
		}
		return out[i].Reason < out[j].Reason
	})
	return out
}

// IDs returns the message IDs of msgs, in their order.
func IDs(msgs []broker.DeadMessage) []string {
	out := make([]string, 0, len(msgs))
	for _, m := range msgs {
		if m.Message != nil {
			out = append(out, m.Message.ID)
		}
	}
	return out
}

// Pick returns the messages of msgs whose ID is in ids, all of msgs when
// ids is nil.
func Pick(msgs []broker.DeadMessage, ids []string) []broker.DeadMessage {
	if ids == nil {
		return msgs
	}
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	var out []broker.DeadMessage
	for _, m := range msgs {
		if m.Message != nil && want[m.Message.ID] {
			out = append(out, m)
		}
	}
	return out
}

// Missing returns the IDs of ids that are not in done, in ids' order.
func Missing(ids, done []string) []string {
	got := map[string]bool{}
	for _, id := range done {
		got[id] = true
	}
	var out []string
	for _, id := range ids {
		if !got[id] {
			out = append(out, id)
		}
	}
	return out
}

// Actor says who acts, for the audit lines: By names the person or
// program (the CLI: the OS user; the console: the operator's name and the
// client's address), Log receives one INFO line per message acted on.
type Actor struct {
	// By is who acts, e.g. "alice" or "alice via console from
	// 127.0.0.1:50412".
	By string
	// Log receives the audit lines; nil discards them.
	Log *slog.Logger
}

func (a Actor) log() *slog.Logger {
	if a.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return a.Log
}

// Replay moves the dead messages ids (all when ids is nil) of d, the DLQ
// of the work queue queue, back to that queue (broker.DeadLetterQueue.Replay),
// and writes one audit line "dlq replay" per message replayed with its id,
// queue, by, at (RFC 3339, UTC), type, attempts and last_error (read from
// the DLQ before the replay). It returns the IDs replayed; an ID not in the
// DLQ is not an error (Missing finds them). On an error, the IDs replayed
// before it are returned and audited too.
func Replay(ctx context.Context, d broker.DeadLetterQueue, queue string, ids []string, a Actor) ([]string, error) {
	before, err := d.List(ctx, 0)
	if err != nil {
		return nil, err
	}
	byID := map[string]broker.DeadMessage{}
	for _, m := range before {
		if m.Message != nil {
			byID[m.Message.ID] = m
		}
	}
	done, err := d.Replay(ctx, ids)
	for _, id := range done {
		m := byID[id]
		attrs := []any{"id", id, "queue", queue, "by", a.By, "at", time.Now().UTC().Format(time.RFC3339)}
		if m.Message != nil {
			attrs = append(attrs, "type", m.Message.Type, "attempts", m.Message.Attempt, "last_error", m.LastError)
		}
		a.log().Info("dlq replay", attrs...)
	}
	return done, err
}

// Purge deletes the dead messages ids (all when ids is nil) of d, the DLQ
// of the work queue queue, for good (broker.DeadLetterQueue.Purge), and
// writes one audit line "dlq purge" per message deleted with its id,
// queue, by and at (RFC 3339, UTC). It returns the IDs deleted; on an
// error, those deleted before it, audited too.
func Purge(ctx context.Context, d broker.DeadLetterQueue, queue string, ids []string, a Actor) ([]string, error) {
	done, err := d.Purge(ctx, ids)
	for _, id := range done {
		a.log().Info("dlq purge", "id", id, "queue", queue, "by", a.By, "at", time.Now().UTC().Format(time.RFC3339))
	}
	return done, err
}
