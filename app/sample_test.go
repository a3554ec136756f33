package app_test

import (
	"bufio"
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/app"
	"github.com/ferrymq/ferry/internal/testenv"
)

// samplePath is the shared sample of 1,000 requests (968 valid, 32 invalid
// on purpose); FERRY_SAMPLE_NOTIFICATIONS overrides it.
func samplePath() string {
	return testenv.Env("FERRY_SAMPLE_NOTIFICATIONS",
		filepath.Join(testenv.RepoRoot(), "..", "shared", "data", "notifications-1000.ndjson"))
}

// TestSample1000 posts every line of the sample: the 968 valid ones are
// accepted (long bodies, CRLF, tabs, emoji, Russian included) and each of
// the 32 invalid ones is rejected with a 4xx naming the field and a
// machine-groupable code.
func TestSample1000(t *testing.T) {
	t.Parallel()
	f, err := os.Open(samplePath())
	require.NoError(t, err, "the sample data set is missing")
	defer f.Close()
	b := setup(t, app.Config{})

	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 4<<20)
	var lines, accepted, rejected int
	byReason := map[string]int{}
	var rejectedLines []int
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		lines++
		r := b.post(t, append([]byte(nil), line...), nil)
		switch {
		case r.status == http.StatusCreated:
			accepted++
		case r.status >= 400 && r.status < 500:
			rejected++
			rejectedLines = append(rejectedLines, lines)
			code, _ := r.obj["code"].(string)
			field, _ := r.obj["field"].(string)
			msg, _ := r.obj["error"].(string)
			require.NotEmpty(t, code, "line %d: %s", lines, r.raw)
			require.NotEmpty(t, field, "line %d: every sample rejection names a field: %s", lines, r.raw)
			require.NotEmpty(t, msg, "line %d", lines)
			byReason[field+"/"+code]++
		default:
			t.Fatalf("line %d: status %d: %s", lines, r.status, r.raw)
		}
	}
	require.NoError(t, sc.Err())
	require.Equal(t, 1000, lines)

	keys := make([]string, 0, len(byReason))
	for k := range byReason {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Logf("rejected %-32s %d", k, byReason[k])
	}
	require.Equal(t, 968, accepted)
	require.Equal(t, 32, rejected)
	// The sample's invalid rows, by what is wrong with them (see
	// shared/data/README.md): missing "to", malformed "to", a numeric
	// user_id, an unknown channel, an empty body, a body over 64 KiB.
	require.Equal(t, map[string]int{
		"to/" + app.CodeMissingField:            8,
		"to/" + app.CodeInvalidAddress:          5,
		"user_id/" + app.CodeInvalidType:        4,
		"channel/" + app.CodeUnsupportedChannel: 5,
		"body/" + app.CodeEmptyField:            8,
		"body/" + app.CodeBodyTooLarge:          2,
	}, byReason)

	n, e := b.counts(t)
	require.Equal(t, 968, n, "one notification per accepted line")
	require.Equal(t, 968, e, "one outbox event per accepted line")
	var maxBody int
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT max(octet_length(body)) FROM notifications`).Scan(&maxBody))
	require.Greater(t, maxBody, 10000, "bodies of tens of KiB are accepted")
}
