package dlq_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/dlq"
)

// TestCause: real last errors of dead messages, from the notification
// app, the brokers and the worker, and what they group under.
func TestCause(t *testing.T) {
	cases := []struct{ in, want string }{
		{"app: notification 960: smtp 127.0.0.1:1025: dial failed: dial tcp 127.0.0.1:1025: connect: connection refused",
			"app: notification N: smtp <addr>: dial failed: dial tcp <addr>: connect: connection refused"},
		{"app: notification 12: smtp mail.example.com:25: 550 5.1.1 <bob@example.com>: Recipient address rejected",
			"app: notification N: smtp <addr>: 550 5.1.1 <<email>>: Recipient address rejected"},
		{"app: notification 13: smtp [::1]:1025: 421 4.7.0 try again later",
			"app: notification N: smtp <addr>: 421 4.7.0 try again later"},
		{"worker: handler timed out after 30s at 2026-12-06T19:45:08.123456Z",
			"worker: handler timed out after <duration> at <time>"},
		{"job 7f3c2a10-5b6e-4c1d-9a2b-0c1d2e3f4a5b: upstream returned HTTP 503 after 1500ms",
			"job <uuid>: upstream returned HTTP 503 after <duration>"},
		{"permanent: order 99812 of user u42: invalid JSON at offset 17",
			"permanent: order N of user u42: invalid JSON at offset N"},
		{"dial tcp localhost:9092: i/o timeout", "dial tcp <addr>: i/o timeout"},
		{"trace 4bf92f3577b34da6a3ce929d0e0e4736 failed", "trace <hex> failed"},
		{"SQLSTATE 23505: duplicate key", "SQLSTATE 23505: duplicate key"},
		{"x509: certificate expired", "x509: certificate expired"},
		{"", ""},
	}
	for _, tc := range cases {
		got := dlq.Cause(tc.in)
		require.Equal(t, tc.want, got, "Cause(%q)", tc.in)
		require.Equal(t, got, dlq.Cause(got), "Cause is idempotent on %q", tc.in)
	}
	// Two different SMTP replies stay two causes.
	require.NotEqual(t, dlq.Cause("smtp a.example.com:25: 550 no such user"), dlq.Cause("smtp a.example.com:25: 421 busy"))
}
