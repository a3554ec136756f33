package nats

import (
	"fmt"
	"sort"
	"strings"

	"github.com/ferrymq/ferry/broker"
)

// encodeName maps a ferry name (letters, digits, '-', '_' and '.', see
// broker.Topology) one to one onto a JetStream stream or consumer name,
// which may not contain '.': '.' becomes '_', '_' becomes "-u" and '-'
// becomes "-h". The mapping is injective, so two exchanges (or queues)
// never share a stream (or consumer), and an encoded name never contains
// '-' followed by anything but 'u' or 'h', which leaves the suffixes
// "-dlq" and "-replay" free for ferry's own streams and subjects.
func encodeName(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 4)
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '.':
			b.WriteByte('_')
		case '_':
			b.WriteString("-u")
		case '-':
			b.WriteString("-h")
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// StreamName returns the JetStream stream of an exchange; the exchange's
// dead letters are in the stream StreamName(exchange)+"-dlq".
func StreamName(exchange string) string { return encodeName(exchange) }

// ConsumerName returns the durable JetStream consumer that holds a queue's
// place in its exchange's stream (StreamName): what `nats consumer info
// STREAM CONSUMER` or the monitoring port's /jsz?consumers=true name. A
// queue "billing.mail-1" has the consumer "billing_mail-h1".
func ConsumerName(queue string) string { return encodeName(queue) }

// names holds the JetStream names of one exchange.
type names struct {
	// stream is the work stream, subjects stream+".>" (events, subject
	// stream+"."+Type) and stream+"-replay.>" (DLQ replays, one subject per
	// queue).
	stream string
	// dlqStream is the DLQ stream, subjects dlqStream+".>" (one subject per
	// queue).
	dlqStream string
}

func namesFor(exchange string) names {
	s := encodeName(exchange)
	return names{stream: s, dlqStream: s + "-dlq"}
}

func (n names) eventSubject(typ string) string    { return n.stream + "." + typ }
func (n names) replaySubject(queue string) string { return n.stream + "-replay." + encodeName(queue) }
func (n names) dlqSubject(queue string) string    { return n.dlqStream + "." + encodeName(queue) }
func (n names) streamSubjects() []string {
	return []string{n.stream + ".>", n.stream + "-replay.>"}
}

// validSubjectWords reports whether s is a dot-separated list of words that
// are literal NATS subject tokens: non-empty, without whitespace, control
// characters, '*' or '>'.
func validSubjectWords(s string) error {
	if s == "" {
		return fmt.Errorf("empty")
	}
	for _, w := range strings.Split(s, ".") {
		if err := validToken(w); err != nil {
			return err
		}
	}
	return nil
}

func validToken(w string) error {
	if w == "" {
		return fmt.Errorf("empty word")
	}
	for _, r := range w {
		if r <= ' ' || r == 0x7f || r == '*' || r == '>' {
			return fmt.Errorf("word %q: whitespace, control characters, '*' and '>' are not allowed in a NATS subject", w)
		}
	}
	return nil
}

// filtersFor maps the AMQP topic bindings of a queue onto JetStream
// consumer filter subjects under the event namespace of n. '*' stays '*';
// a trailing '#' (zero or more words) becomes two filters, the prefix
// itself and prefix+".>", and a lone '#' becomes stream+".>". A '#' before
// the last word has no NATS equivalent: that binding returns an error
// wrapping broker.ErrUnsupported. Filters subsumed by another are dropped;
// filters that still overlap (NATS refuses overlapping filters in one
// consumer) also return an error wrapping broker.ErrUnsupported.
func filtersFor(n names, queue string, bindings []string) ([]string, error) {
	var out []string
	for _, b := range bindings {
		if err := broker.ValidatePattern(b); err != nil {
			return nil, fmt.Errorf("nats: queue %s: binding %q: %w", queue, b, err)
		}
		words := strings.Split(b, ".")
		// Collapse a trailing run of '#' into one.
		for len(words) > 1 && words[len(words)-1] == "#" && words[len(words)-2] == "#" {
			words = words[:len(words)-1]
		}
		for i, w := range words {
			if w == "#" && i != len(words)-1 {
				return nil, fmt.Errorf("%w: nats: queue %s: binding %q: '#' is only supported as the last word (NATS has no multi-word wildcard inside a subject)",
					broker.ErrUnsupported, queue, b)
			}
			if w != "#" && w != "*" {
				if err := validToken(w); err != nil {
					return nil, fmt.Errorf("%w: nats: queue %s: binding %q: %v", broker.ErrUnsupported, queue, b, err)
				}
			}
		}
		if words[len(words)-1] == "#" {
			prefix := words[:len(words)-1]
			if len(prefix) == 0 {
				out = append(out, n.stream+".>")
				continue
			}
			p := n.stream + "." + strings.Join(prefix, ".")
			out = append(out, p, p+".>")
			continue
		}
		out = append(out, n.eventSubject(strings.Join(words, ".")))
	}
	out = reduceFilters(out)
	for i := 0; i < len(out); i++ {
		for j := i + 1; j < len(out); j++ {
			if subjectsCollide(out[i], out[j]) {
				return nil, fmt.Errorf("%w: nats: queue %s: bindings map to overlapping subject filters %q and %q, which one JetStream consumer cannot hold; bind one pattern that covers both",
					broker.ErrUnsupported, queue, out[i], out[j])
			}
		}
	}
	return out, nil
}

// reduceFilters removes duplicates and filters covered by another filter,
// and sorts the result.
func reduceFilters(in []string) []string {
	sort.Strings(in)
	var out []string
	for i, f := range in {
		covered := false
		for j, g := range in {
			if i == j {
				continue
			}
			if f == g {
				if j < i { // keep the first of equal filters
					covered = true
					break
				}
				continue
			}
			if subjectSubset(f, g) {
				covered = true
				break
			}
		}
		if !covered {
			out = append(out, f)
		}
	}
	return out
}

// subjectSubset reports whether every subject matched by filter a is also
// matched by filter b (NATS wildcards '*' and '>').
func subjectSubset(a, b string) bool {
	at, bt := strings.Split(a, "."), strings.Split(b, ".")
	for i, w := range bt {
		if w == ">" {
			return len(at) > i
		}
		if i >= len(at) {
			return false
		}
		switch {
		case at[i] == ">":
			return false
		case w == "*":
		case at[i] != w:
			return false
		}
	}
	return len(at) == len(bt)
}

// subjectsCollide reports whether some subject matches both filters.
func subjectsCollide(a, b string) bool {
	at, bt := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; ; i++ {
		if i == len(at) || i == len(bt) {
			return len(at) == len(bt)
		}
		x, y := at[i], bt[i]
		if x == ">" || y == ">" {
			return true
		}
		if x != "*" && y != "*" && x != y {
			return false
		}
	}
}
