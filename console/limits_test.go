package console_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/console"
)

// apiLimits is api/limits' answer as docs/console.md documents it.
type apiLimits struct {
	Now   time.Time `json:"now"`
	Slots []struct {
		Limit   string `json:"limit"`
		Key     string `json:"key"`
		Held    int    `json:"held"`
		Expired int    `json:"expired"`
		Slots   []struct {
			Slot       int       `json:"slot"`
			Holder     string    `json:"holder"`
			AcquiredAt time.Time `json:"acquired_at"`
			ExpiresAt  time.Time `json:"expires_at"`
			Expired    bool      `json:"expired"`
		} `json:"slots"`
	} `json:"slots"`
	SlotsTruncated bool `json:"slots_truncated"`
	Rates          []struct {
		Limit     string    `json:"limit"`
		Key       string    `json:"key"`
		TAT       time.Time `json:"tat"`
		Throttled bool      `json:"throttled"`
	} `json:"rates"`
	RatesTruncated bool `json:"rates_truncated"`
	Waiters        []struct {
		Consumer string `json:"consumer"`
		Waiting  int64  `json:"waiting"`
		Snoozes  int64  `json:"snoozes"`
		Samples  []struct {
			MessageID string    `json:"message_id"`
			Snoozes   int       `json:"snoozes"`
			Attempts  int       `json:"attempts"`
			LastError string    `json:"last_error"`
			Since     time.Time `json:"since"`
			UpdatedAt time.Time `json:"updated_at"`
		} `json:"samples"`
	} `json:"waiters"`
	WaitersTruncated   bool `json:"waiters_truncated"`
	ConsumersTruncated bool `json:"consumers_truncated"`
}

func (c *client) limits() (apiLimits, map[string]json.RawMessage) {
	c.t.Helper()
	code, body, h := c.get("/api/limits")
	require.Equal(c.t, http.StatusOK, code, body)
	require.Equal(c.t, "application/json", h.Get("Content-Type"))
	var l apiLimits
	require.NoError(c.t, json.Unmarshal([]byte(body), &l))
	var raw map[string]json.RawMessage
	require.NoError(c.t, json.Unmarshal([]byte(body), &raw))
	return l, raw
}

// TestLimitsPageAndAPI: the limits page and api/limits on PostgreSQL
// (no broker: they read only the database). Empty, the page says what it
// would show and how to get limits, and the API's lists are [] (never
// null). With slot rows (one live, one whose lease expired, one released
// as the worker releases it, with -infinity, and one with hostile text), a
// throttled and an idle rate row, and attempt records (snoozed ones, with
// and without a failed attempt before; a dead one and a failed, never
// snoozed one, which do not wait): the page shows each holder with its
// lease, marks the expired one, leaves the released one out, marks the
// throttled rate, counts the waiters per consumer with their message ids
// and last errors, says what last_error holds for a snooze, and renders
// the hostile text as text; the API gives the same.
func TestLimitsPageAndAPI(t *testing.T) {
	t.Parallel()
	bu := setup(t, "", console.Config{})
	c := newClient(t, bu.base)

	code, body, _ := c.get("/limits")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `id="none"`, "the empty state")
	require.Contains(t, body, "No limit has any state on this database")
	require.Contains(t, body, "ferry.WithConcurrency(5")
	require.Contains(t, body, "ferry.WithRateLimit(100, 20)")
	require.Contains(t, body, `href="/ops/limits" class="on">Limits</a>`, "linked from the navigation, and marked")
	_, overview, _ := c.get("/")
	require.Contains(t, overview, `href="/ops/limits">Limits</a>`, "every page links to it")
	empty, raw := c.limits()
	require.Empty(t, empty.Slots)
	require.Empty(t, empty.Rates)
	require.Empty(t, empty.Waiters)
	for _, k := range []string{"slots", "rates", "waiters"} {
		require.Equal(t, "[]", string(raw[k]), "%s is [] when empty", k)
	}
	require.WithinDuration(t, time.Now(), empty.Now, time.Minute, "now is the database's clock")

	hostileKey := `"><img src=x onerror=alert(1)>`
	_, err := bu.pool.Exec(bu.ctx, `INSERT INTO worker_flow_slots (limit_name, key, slot, holder, acquired_at, expires_at) VALUES
	('mailer/invoice.render', 'acme', 0, 'host-a:101:1001:a1b2c3d4e5f6', now() - interval '10 seconds', now() + interval '20 seconds'),
	('mailer/invoice.render', 'acme', 1, 'host-b:202:1002:0f1e2d3c4b5a', now() - interval '2 minutes', now() - interval '90 seconds'),
	('mailer/invoice.render', 'globex', 0, '', now() - interval '5 seconds', '-infinity'),
	('provider <script>alert(2)</script>', $1, 0, '<script>alert(3)</script>', now(), now() + interval '30 seconds')`, hostileKey)
	require.NoError(t, err)
	_, err = bu.pool.Exec(bu.ctx, `INSERT INTO worker_flow_rates (limit_name, key, tat) VALUES
	('provider.call', '', now() + interval '30 seconds'),
	('provider.call', 'quiet', now() - interval '1 minute')`)
	require.NoError(t, err)
	_, err = bu.pool.Exec(bu.ctx, `INSERT INTO worker_attempts (consumer, message_id, attempts, last_error, dead, snoozes) VALUES
	('mailer', '1001', 0, '', false, 3),
	('mailer', '1002', 1, 'smtp: 451 <b>try</b> later', false, 1),
	('mailer', '1003', 2, 'worker: snoozed 1000 times', true, 1000),
	('mailer', '1004', 2, 'boom', false, 0),
	('billing', '2001', 0, '', false, 2)`)
	require.NoError(t, err)

	code, body, _ = c.get("/limits")
	require.Equal(t, http.StatusOK, code, body)
	require.NotContains(t, body, `id="none"`)
	for _, bad := range []string{"<script>alert", "<img src=x", `"><img`, "<b>try</b>"} {
		require.NotContains(t, body, bad, "a table's text renders as HTML")
	}
	require.Contains(t, body, "&lt;script&gt;alert(3)&lt;/script&gt;", "a hostile holder as text")
	require.Contains(t, body, "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;", "a hostile key as text")
	// Slots: the group, the live holder, the expired one marked.
	require.Contains(t, body, `limit <span class="limit">mailer/invoice.render</span> · key <span class="key">acme</span> · <b>1</b> held, <b class="err">1</b> expired`)
	require.Contains(t, body, `<tr class="slot"><td class="n">0</td><td class="holder">host-a:101:1001:a1b2c3d4e5f6</td>`)
	require.Contains(t, body, `<tr class="slot expired"><td class="n">1</td><td class="holder">host-b:202:1002:0f1e2d3c4b5a</td>`)
	require.Regexp(t, `host-b:202:1002:0f1e2d3c4b5a</td><td>[^<]+ <span class="hint">\(2m[0-3]s ago\)</span></td>\s*<td><span class="state state-expired">expired</span> 1m3[0-3]s ago`, body)
	require.Regexp(t, `host-a:101:1001:a1b2c3d4e5f6</td><td>[^<]+ <span class="hint">\(1[0-3]s ago\)</span></td>\s*<td><span class="state state-held">held</span> until [^<]+ <span class="hint">\(in (20|1[7-9])s\)</span>`, body)
	require.NotContains(t, body, "globex", "a released slot is not listed")
	require.Contains(t, body, "3 slot(s) listed, 1 with an expired lease.")
	// Rates.
	require.Regexp(t, `<td>provider.call</td><td><i>none</i></td><td>[^<]+</td>\s*<td><span class="state state-throttled">throttled</span> <span class="hint">\(tat [0-9.]+m?s ahead\)</span>`, body)
	require.Regexp(t, `<td>provider.call</td><td>quiet</td><td>[^<]+</td>\s*<td><span class="state">not throttled</span>`, body)
	// Waiters: per consumer, most waiting first; the dead and the never
	// snoozed records do not wait.
	require.Contains(t, body, `consumer <span class="consumer">mailer</span> · <b class="waiting">2</b> message(s) waiting · 4 snooze(s) in all`)
	require.Contains(t, body, `consumer <span class="consumer">billing</span> · <b class="waiting">1</b> message(s) waiting · 2 snooze(s) in all`)
	require.Less(t, strings.Index(body, `<span class="consumer">mailer</span>`), strings.Index(body, `<span class="consumer">billing</span>`))
	require.Contains(t, body, `<a class="wait-msg" href="/ops/story?q=1001">1001</a></td><td class="n">3</td><td class="n">0</td>`)
	require.Contains(t, body, `<a class="wait-msg" href="/ops/story?q=1002">1002</a></td><td class="n">1</td><td class="n">1</td>`)
	require.Less(t, strings.Index(body, ">1001</a>"), strings.Index(body, ">1002</a>"), "most snoozed first")
	require.Contains(t, body, `<span class="err">smtp: 451 &lt;b&gt;try&lt;/b&gt; later</span>`)
	require.Contains(t, body, "none: no attempt failed")
	require.NotContains(t, body, ">1003<", "a dead record does not wait")
	require.NotContains(t, body, ">1004<", "a failed record never snoozed does not wait")
	require.Contains(t, body, "a snooze writes no error. The column is the error of the message's last <i>failed attempt</i>, and is empty when no attempt failed")

	l, _ := c.limits()
	require.Len(t, l.Slots, 2)
	g := l.Slots[0]
	require.Equal(t, "mailer/invoice.render", g.Limit)
	require.Equal(t, "acme", g.Key)
	require.Equal(t, 1, g.Held)
	require.Equal(t, 1, g.Expired)
	require.Len(t, g.Slots, 2)
	require.Equal(t, "host-a:101:1001:a1b2c3d4e5f6", g.Slots[0].Holder)
	require.False(t, g.Slots[0].Expired)
	// The rows were written moments ago (a slow machine: seconds).
	require.InDelta(t, 20, g.Slots[0].ExpiresAt.Sub(l.Now).Seconds(), 3)
	require.InDelta(t, 10, l.Now.Sub(g.Slots[0].AcquiredAt).Seconds(), 3)
	require.Equal(t, "host-b:202:1002:0f1e2d3c4b5a", g.Slots[1].Holder)
	require.True(t, g.Slots[1].Expired)
	require.Equal(t, "provider <script>alert(2)</script>", l.Slots[1].Limit)
	require.Equal(t, hostileKey, l.Slots[1].Key)
	require.Equal(t, "<script>alert(3)</script>", l.Slots[1].Slots[0].Holder)
	require.False(t, l.SlotsTruncated)

	require.Len(t, l.Rates, 2)
	require.Equal(t, "provider.call", l.Rates[0].Limit)
	require.Equal(t, "", l.Rates[0].Key)
	require.True(t, l.Rates[0].Throttled)
	require.InDelta(t, 30, l.Rates[0].TAT.Sub(l.Now).Seconds(), 3)
	require.Equal(t, "quiet", l.Rates[1].Key)
	require.False(t, l.Rates[1].Throttled)

	require.Len(t, l.Waiters, 2)
	m := l.Waiters[0]
	require.Equal(t, "mailer", m.Consumer)
	require.Equal(t, int64(2), m.Waiting)
	require.Equal(t, int64(4), m.Snoozes)
	require.Len(t, m.Samples, 2)
	require.Equal(t, "1001", m.Samples[0].MessageID)
	require.Equal(t, 3, m.Samples[0].Snoozes)
	require.Equal(t, "", m.Samples[0].LastError)
	require.Equal(t, "1002", m.Samples[1].MessageID)
	require.Equal(t, 1, m.Samples[1].Attempts)
	require.Equal(t, "smtp: 451 <b>try</b> later", m.Samples[1].LastError)
	require.WithinDuration(t, l.Now, m.Samples[1].Since, time.Minute)
	require.Equal(t, "billing", l.Waiters[1].Consumer)
	require.Equal(t, int64(1), l.Waiters[1].Waiting)
	require.Equal(t, int64(2), l.Waiters[1].Snoozes)
	require.False(t, l.WaitersTruncated)
	require.False(t, l.ConsumersTruncated)
}

// TestLimitsPageIsBounded: with more rows than the page lists (600 slots
// held, 250 rate rows, 10,050 waiting messages over 60 consumers) the page
// lists 500 slots, 200 rates and 50 consumers with 5 messages each, and
// says so; so does the API. The page's time is logged.
func TestLimitsPageIsBounded(t *testing.T) {
	t.Parallel()
	bu := setup(t, "", console.Config{})
	c := newClient(t, bu.base)
	_, err := bu.pool.Exec(bu.ctx, `INSERT INTO worker_flow_slots (limit_name, key, slot, holder, expires_at)
SELECT 'big', 'k' || (s / 100), s % 100, 'holder-' || s, now() + interval '30 seconds' FROM generate_series(0, 599) s`)
	require.NoError(t, err)
	_, err = bu.pool.Exec(bu.ctx, `INSERT INTO worker_flow_rates (limit_name, key, tat)
SELECT 'big', 'k' || lpad(s::text, 3, '0'), now() + interval '1 second' FROM generate_series(0, 249) s`)
	require.NoError(t, err)
	_, err = bu.pool.Exec(bu.ctx, `INSERT INTO worker_attempts (consumer, message_id, attempts, snoozes)
SELECT 'consumer-' || lpad((s % 60)::text, 2, '0'), 'm' || s, 0, 1 + s % 7 FROM generate_series(0, 10049) s`)
	require.NoError(t, err)

	start := time.Now()
	code, body, _ := c.get("/limits")
	took := time.Since(start)
	require.Equal(t, http.StatusOK, code, body)
	t.Logf("the limits page with 600 slots, 250 rates and 10,050 waiting messages: %v", took)
	require.Contains(t, body, "500 slot(s) listed, 0 with an expired lease; <span class=\"warn\">more rows than 500: only the first 500 by limit, key and slot are listed</span>")
	require.Equal(t, 500, strings.Count(body, `<tr class="slot">`))
	require.Contains(t, body, "More rows than 200: only the first 200 by limit and key are listed.")
	require.Contains(t, body, "More than 10000 messages wait: the counts are of the first 10000 read.")
	require.Contains(t, body, "More than 50 consumers have waiting messages: the 50 with the most are listed.")
	require.Equal(t, 250, strings.Count(body, `<tr class="waiter">`))

	l, _ := c.limits()
	n := 0
	for _, g := range l.Slots {
		n += len(g.Slots)
	}
	require.Equal(t, 500, n)
	require.True(t, l.SlotsTruncated)
	require.Len(t, l.Rates, 200)
	require.True(t, l.RatesTruncated)
	require.Len(t, l.Waiters, 50)
	require.True(t, l.WaitersTruncated)
	require.True(t, l.ConsumersTruncated)
	var counted int64
	for _, w := range l.Waiters {
		require.Len(t, w.Samples, 5, w.Consumer)
		for i := 1; i < len(w.Samples); i++ {
			require.GreaterOrEqual(t, w.Samples[i-1].Snoozes, w.Samples[i].Snoozes, "most snoozed first")
		}
		counted += w.Waiting
	}
	require.LessOrEqual(t, counted, int64(10000), "the counts are of the first 10,000 read")
}
