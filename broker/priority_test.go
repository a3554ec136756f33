package broker

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPriorityTypeRoundTrip(t *testing.T) {
	for p := 0; p <= MaxPriority; p++ {
		got, typ := SplitPriorityType(PriorityType(p, "job.work"))
		require.Equal(t, p, got)
		require.Equal(t, "job.work", typ)
	}
	// Not a priority prefix: kept as it is.
	for _, s := range []string{"ferry-px.a", "ferry-p01.a", "ferry-p9.a", "ferry-p1", "job.work"} {
		p, typ := SplitPriorityType(s)
		require.Zero(t, p, s)
		require.Equal(t, s, typ)
	}
}

// The expanded topology routes each priority to exactly one level of a
// queue with priorities, and every priority to a queue without them.
func TestExpandedRoutesEachPriorityToOneLevel(t *testing.T) {
	top := Topology{Exchange: "x", Queues: []Queue{
		{Name: "jobs", Bindings: []string{"job.#"}, Priorities: 3},
		{Name: "audit", Bindings: []string{"#"}},
	}}
	require.NoError(t, top.Validate())
	e := top.Expanded()
	require.NoError(t, Topology{Exchange: "x", Queues: []Queue{{Name: "jobs", Bindings: []string{"a"}}}}.Validate())
	matches := func(q Queue, typ string) bool {
		for _, b := range q.Bindings {
			if MatchRoutingKey(b, typ) {
				return true
			}
		}
		return false
	}
	for p := 0; p <= MaxPriority; p++ {
		typ := PriorityType(p, "job.work")
		var levels []string
		audit := false
		for _, q := range e.Queues {
			if q.Name == "audit" {
				audit = matches(q, typ)
			} else if matches(q, typ) {
				levels = append(levels, q.Name)
			}
		}
		want := []string{"jobs", "jobs.p1", "jobs.p2", "jobs.p2", "jobs.p2"}[p]
		require.Equal(t, []string{want}, levels, "priority %d", p)
		require.True(t, audit, "priority %d reaches the queue without priorities", p)
	}
	require.Equal(t, top, Topology{Exchange: "x", Queues: top.Queues}, "Expanded leaves its receiver alone")
	plain := Topology{Exchange: "x", Queues: []Queue{{Name: "a", Bindings: []string{"#"}}}}
	require.Equal(t, plain, plain.Expanded())
}

// In a topology with priorities a wildcard-led pattern would match the
// prefix word ("*.created" takes "ferry-p1.created"): refused on every
// queue but "#" alone, whose queue takes every Type as it is.
func TestPrioritiesRefuseWildcardLedPatterns(t *testing.T) {
	for _, b := range []string{"*.created", "#.created", "*.*.b"} {
		err := Topology{Exchange: "x", Queues: []Queue{
			{Name: "jobs", Bindings: []string{"job.#"}, Priorities: 2},
			{Name: "audit", Bindings: []string{"a.*", b}},
		}}.Validate()
		require.ErrorContains(t, err, "no queue may bind a pattern whose first word is a wildcard", b)
	}
	require.NoError(t, Topology{Exchange: "x", Queues: []Queue{{Name: "audit", Bindings: []string{"*.created"}}}}.Validate(),
		"without priorities the pattern is fine")
	top := Topology{Exchange: "x", Queues: []Queue{
		{Name: "jobs", Bindings: []string{"job.#"}, Priorities: 2},
		{Name: "all", Bindings: []string{"#"}},
	}}
	require.NoError(t, top.Validate())
	require.Equal(t, []string{"#"}, top.Expanded().Queues[2].Bindings, "\"#\" needs no prefixed binding")
}
