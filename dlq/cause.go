package dlq

import (
	"regexp"
	"strings"
)

// causePatterns are what Cause replaces, in this order: the parts of an
// error text that differ from one message to the next while the cause is
// the same (timestamps, UUIDs, mail and network addresses, durations, long
// hex ids, numbers).
var causePatterns = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?`), "<time>"},
	{regexp.MustCompile(`\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b`), "<uuid>"},
	{regexp.MustCompile(`[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+`), "<email>"},
	{regexp.MustCompile(`\[[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*\](?::\d+)?`), "<addr>"},
	{regexp.MustCompile(`\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b`), "<addr>"},
	{regexp.MustCompile(`\b(?:localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}):\d+\b`), "<addr>"},
	{regexp.MustCompile(`\b\d+(?:\.\d+)?(?:ns|µs|us|ms|s|m|h)\b`), "<duration>"},
	{regexp.MustCompile(`\b(?:[0-9a-fA-F]*[0-9][0-9a-fA-F]*[a-fA-F]|[0-9a-fA-F]*[a-fA-F][0-9a-fA-F]*[0-9])[0-9a-fA-F]*\b`), "<hex>"},
}

// statusCode matches what Cause keeps of the numbers: a reply code of
// three digits (SMTP, HTTP) at the start of a reply, after ": ", "status ",
// "code ", "SMTP " or "HTTP ", an enhanced SMTP status code (RFC 3463, 5.1.1) and
// a PostgreSQL SQLSTATE: a 550 and a 421 are different causes.
var statusCode = regexp.MustCompile(`(?:^|: |status |code |SMTP |smtp |HTTP |HTTP/\d(?:\.\d)? )[2-5]\d\d\b|\b[245]\.\d{1,3}\.\d{1,3}\b|\bSQLSTATE [0-9A-Z]{5}\b`)

// number is every other run of digits standing alone.
var number = regexp.MustCompile(`\b\d+\b`)

// Cause is the cause of a dead message's last error: the error text with
// what changes from one message to the next replaced by placeholders, so
// that the same failure of many messages is one cause. Timestamps (RFC
// 3339 and the like) become <time>, UUIDs <uuid>, mail addresses <email>,
// IP addresses and host:port pairs <addr>, durations (300ms, 1.5s)
// <duration>, hex ids with letters and digits (8 or more characters)
// <hex>, and other numbers N, except SMTP and HTTP reply codes (550,
// 5.1.1, HTTP 503) and SQLSTATEs, which tell causes apart. For example
//
//	app: notification 960: smtp 127.0.0.1:1025: dial tcp 127.0.0.1:1025: connect: connection refused
//
// is
//
//	app: notification N: smtp <addr>: dial tcp <addr>: connect: connection refused
//
// Cause(Cause(s)) is Cause(s). GroupByReason groups by it, and
// Filter.Reason selects by it.
func Cause(lastError string) string {
	s := lastError
	for _, p := range causePatterns {
		if p.with == "<hex>" {
			s = p.re.ReplaceAllStringFunc(s, func(h string) string {
				if len(h) < 8 {
					return h
				}
				return "<hex>"
			})
			continue
		}
		s = p.re.ReplaceAllString(s, p.with)
	}
	// Keep the reply codes out of the number rule: set them aside as
	// placeholders without digits, then put them back.
	var kept []string
	s = statusCode.ReplaceAllStringFunc(s, func(c string) string {
		kept = append(kept, c)
		return "\x00" + strings.Repeat("\x01", len(kept)) + "\x00"
	})
	s = number.ReplaceAllString(s, "N")
	for i := len(kept) - 1; i >= 0; i-- {
		s = strings.Replace(s, "\x00"+strings.Repeat("\x01", i+1)+"\x00", kept[i], 1)
	}
	return s
}
