package nats

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
)

func TestEncodeNameInjective(t *testing.T) {
	seen := map[string]string{}
	for _, s := range []string{"a.b", "a_b", "a-b", "a__b", "a._b", "a_.b", "a-u", "a_", "a.", "a-hb", "a-.b", "notifications"} {
		e := encodeName(s)
		require.NotContains(t, e, ".")
		if prev, ok := seen[e]; ok {
			t.Fatalf("encodeName(%q) == encodeName(%q) == %q", s, prev, e)
		}
		seen[e] = s
	}
	require.Equal(t, "notifications_send", encodeName("notifications.send"))
	require.Equal(t, "billing_mail-h1", ConsumerName("billing.mail-1"), "ConsumerName's doc comment")
	// The suffixes of ferry's own streams never collide with an encoded name.
	require.NotEqual(t, encodeName("x.dlq"), namesFor("x").dlqStream)
	require.NotEqual(t, encodeName("x-dlq"), namesFor("x").dlqStream)
}

func TestFiltersFor(t *testing.T) {
	n := namesFor("ex")
	cases := []struct {
		bindings []string
		want     []string
	}{
		{[]string{"order.created"}, []string{"ex.order.created"}},
		{[]string{"order.*"}, []string{"ex.order.*"}},
		{[]string{"order.#"}, []string{"ex.order", "ex.order.>"}},
		{[]string{"#"}, []string{"ex.>"}},
		{[]string{"*.created.#"}, []string{"ex.*.created", "ex.*.created.>"}},
		{[]string{"order.#.#"}, []string{"ex.order", "ex.order.>"}},
		// Subsumed filters are dropped, duplicates merged.
		{[]string{"order.*", "order.created", "order.*"}, []string{"ex.order.*"}},
		{[]string{"#", "order.created"}, []string{"ex.>"}},
		{[]string{"a.b", "c.d"}, []string{"ex.a.b", "ex.c.d"}},
	}
	for _, c := range cases {
		got, err := filtersFor(n, "q", c.bindings)
		require.NoError(t, err, "%v", c.bindings)
		require.Equal(t, c.want, got, "%v", c.bindings)
	}
	for _, bad := range [][]string{{"a.#.b"}, {"#.a"}, {"a.*", "*.b"}, {"a.>"}} {
		_, err := filtersFor(n, "q", bad)
		require.ErrorIs(t, err, broker.ErrUnsupported, "%v", bad)
	}
}

// TestFiltersAgreeWithAMQP checks the NATS filters against the contract's
// matcher on a set of routing keys.
func TestFiltersAgreeWithAMQP(t *testing.T) {
	n := namesFor("ex")
	keys := []string{"order", "order.created", "order.created.eu", "invoice.created", "a", "a.b.c.d", "created"}
	for _, p := range []string{"order.*", "order.#", "*.created.#", "#", "*", "*.*", "order.created", "a.#", "*.#"} {
		filters, err := filtersFor(n, "q", []string{p})
		require.NoError(t, err, p)
		for _, k := range keys {
			subj := n.eventSubject(k)
			match := false
			for _, f := range filters {
				if subjectSubset(subj, f) {
					match = true
				}
			}
			require.Equal(t, broker.MatchRoutingKey(p, k), match, "pattern %q key %q filters %v", p, k, filters)
		}
	}
}

func TestSubjectRelations(t *testing.T) {
	require.True(t, subjectSubset("a.b", "a.*"))
	require.True(t, subjectSubset("a.b.c", "a.>"))
	require.False(t, subjectSubset("a", "a.>"))
	require.False(t, subjectSubset("a.>", "a.*"))
	require.True(t, subjectSubset("a.*", "a.>"))
	require.True(t, subjectsCollide("a.*", "*.b"))
	require.False(t, subjectsCollide("a", "a.>"))
	require.True(t, subjectsCollide("a.>", "a.b.c"))
	require.False(t, subjectsCollide("a.b", "a.c"))
	require.False(t, subjectsCollide("a.b", "a.b.c"))
}

func TestWireHeadersValidation(t *testing.T) {
	for _, h := range []map[string]string{
		{"": "v"},
		{"Nats-Expected-Stream": "x"},
		{"ferry-id": "x"},
		{"bad key": "v"},
		{"k:x": "v"},
		{"k": "line\r\nInjected: yes"},
	} {
		_, err := wireHeaders(&broker.Message{ID: "1", Type: "a", Headers: h})
		require.Error(t, err, "%v", h)
	}
	h, err := wireHeaders(&broker.Message{ID: "1", Type: "a.b", Key: "k", Headers: map[string]string{"x-created-at": "t", "MixedCase": "v"}})
	require.NoError(t, err)
	m := fromWire("ex.a.b", "ex.", h, nil)
	require.Equal(t, "1", m.ID)
	require.Equal(t, "a.b", m.Type)
	require.Equal(t, "k", m.Key)
	require.Equal(t, map[string]string{"x-created-at": "t", "MixedCase": "v"}, m.Headers)
}
