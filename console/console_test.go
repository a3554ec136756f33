package console_test

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/console"
	"github.com/ferrymq/ferry/outbox"
)

// client is a browser stand-in: a cookie jar, and the CSRF token of the
// last form it read.
type client struct {
	t    *testing.T
	base string
	http *http.Client
	csrf string
}

func newClient(t *testing.T, base string) *client {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &client{t: t, base: base, http: &http.Client{Jar: jar}}
}

var csrfField = regexp.MustCompile(`name="csrf" value="([0-9a-f]{64})"`)

func (c *client) get(path string) (int, string, http.Header) {
	c.t.Helper()
	resp, err := c.http.Get(c.base + path)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	if m := csrfField.FindSubmatch(b); m != nil {
		c.csrf = string(m[1])
	}
	return resp.StatusCode, string(b), resp.Header
}

func (c *client) post(path string, form url.Values, hdr map[string]string) (int, string) {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.base+path, strings.NewReader(form.Encode()))
	require.NoError(c.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.http.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	return resp.StatusCode, string(b)
}

// park makes row id a parked row, as a failed publication does.
func park(t *testing.T, bu *bundle, id int64) {
	_, err := bu.pool.Exec(bu.ctx, `UPDATE outbox SET attempts = 2, last_error = $2 WHERE id = $1`, id, `unroutable: <script>alert(1)</script>`)
	require.NoError(t, err)
}

// TestPagesHeadersAndHostilePayloads: every page answers 200 with the
// security headers; what came from an event (body, key, app id, header,
// error text, invalid UTF-8) renders as text.
func TestPagesHeadersAndHostilePayloads(t *testing.T) {
	bu := setup(t, "nats", console.Config{Token: testToken})
	hostileKey := `"><img src=x onerror=alert(1)>`
	ids := bu.enqueue(t, outbox.Event{Type: "job.idle", Destination: "idle", Key: hostileKey, AppID: hostileKey,
		Headers: map[string]string{"note": `<script>alert(2)</script>`}, Body: []byte(hostile)})
	park(t, bu, ids[0])
	bu.enqueue(t, outbox.Event{Type: "job.run", AppID: "dead-one", Body: []byte(hostile)})
	dead := bu.waitDead(t, 1)
	c := newClient(t, bu.base)
	id := strconv.FormatInt(ids[0], 10)
	for _, p := range []string{"/", "/outbox", "/outbox?state=pending", "/outbox?state=scheduled", "/outbox?state=parked&error=unroutable",
		"/outbox/row?id=" + id, "/outbox/confirm?op=retry&id=" + id, "/dlq", "/dlq?queue=" + url.QueryEscape(bu.queue) + "&app_id=dead-one",
		"/dlq/message?queue=" + url.QueryEscape(bu.queue) + "&id=" + dead[0].Message.ID, "/story?q=" + url.QueryEscape(hostileKey), "/story?q=" + id, "/login",
		"/api/overview", "/static/style.css", "/static/console.js"} {
		code, body, h := c.get(p)
		require.Equal(t, http.StatusOK, code, "GET %s: %s", p, body)
		require.Contains(t, h.Get("Content-Security-Policy"), "frame-ancestors 'none'", p)
		require.NotContains(t, h.Get("Content-Security-Policy"), "unsafe-inline", p)
		require.Equal(t, "DENY", h.Get("X-Frame-Options"), p)
		require.Equal(t, "nosniff", h.Get("X-Content-Type-Options"), p)
		require.True(t, utf8.ValidString(body), "GET %s: the page is valid UTF-8", p)
		for _, bad := range []string{"<script>alert", "<script>document", "<img src=x", `"><img`} {
			require.NotContains(t, body, bad, "GET %s renders a payload as HTML", p)
		}
		if strings.HasPrefix(p, "/outbox/row") || strings.HasPrefix(p, "/dlq/message") {
			require.Contains(t, body, "&lt;script&gt;document.title=", "GET %s shows the body as text", p)
			require.Contains(t, body, "\uFFFD", "GET %s shows invalid UTF-8 as U+FFFD", p)
		}
	}
	code, body, _ := c.get("/outbox?state=parked")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "1 parked row(s) in all")
	require.Contains(t, body, "&lt;script&gt;alert(1)&lt;/script&gt;", "the error text as text")
}

// TestBadInputIs4xx: a bad parameter is a 400 or 404 with its reason.
func TestBadInputIs4xx(t *testing.T) {
	bu := setup(t, "nats", console.Config{Token: testToken})
	c := newClient(t, bu.base)
	for p, want := range map[string]int{
		"/outbox?min_age=soon": 400, "/outbox?after=-1": 400, "/outbox?state=lost": 400, "/outbox/row?id=abc": 400,
		"/outbox/row?id=999999": 404, "/dlq?queue=nope": 404, "/dlq?offset=x": 400, "/dlq/message?queue=nope&id=1": 404,
		"/dlq/confirm?op=explode": 400, "/dlq/confirm?op=replay&queue=" + url.QueryEscape(bu.queue) + "&scope=some": 400,
		"/nowhere": 404,
	} {
		code, body, _ := c.get(p)
		require.Equal(t, want, code, "GET %s: %s", p, body)
	}
	resp, err := http.Get(bu.srv.URL + "/elsewhere")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode, "outside the prefix")
}

// TestPaging: lists say how many there are in all and page through every
// row, none twice, none left out.
func TestPaging(t *testing.T) {
	bu := setup(t, "", console.Config{Token: testToken})
	var evs []outbox.Event
	for range 120 {
		evs = append(evs, outbox.Event{Type: "job.idle", Destination: "idle", Body: []byte(`{}`)})
	}
	ids := bu.enqueue(t, evs...)
	c := newClient(t, bu.base)
	next := regexp.MustCompile(`rel="next" href="[^"]*after=(\d+)"`)
	row := regexp.MustCompile(`outbox/row\?id=(\d+)`)
	seen := map[string]bool{}
	path := "/outbox?state=pending"
	for pages := 0; ; pages++ {
		require.Less(t, pages, 5)
		code, body, _ := c.get(path)
		require.Equal(t, http.StatusOK, code, body)
		require.Contains(t, body, "120 pending row(s) in all")
		for _, m := range row.FindAllStringSubmatch(body, -1) {
			require.False(t, seen[m[1]], "row %s on two pages", m[1])
			seen[m[1]] = true
		}
		m := next.FindStringSubmatch(body)
		if m == nil {
			break
		}
		path = "/outbox?state=pending&after=" + m[1]
	}
	require.Len(t, seen, len(ids))
}

// TestActionsNeedTokenAndCSRF: an action without the CSRF token, from
// another origin, without the token or with a wrong one is refused and
// changes nothing; with both it is done and audited.
func TestActionsNeedTokenAndCSRF(t *testing.T) {
	bu := setup(t, "", console.Config{Token: testToken})
	ids := bu.enqueue(t, outbox.Event{Type: "job.idle", Destination: "idle", Body: []byte(`{}`)}, outbox.Event{Type: "job.idle", Destination: "idle", Body: []byte(`{}`)})
	park(t, bu, ids[0])
	park(t, bu, ids[1])
	c := newClient(t, bu.base)
	code, _, _ := c.get("/outbox/confirm?op=drop&id=" + strconv.FormatInt(ids[0], 10))
	require.Equal(t, http.StatusOK, code)
	require.NotEmpty(t, c.csrf)
	form := func(token, csrf string) url.Values {
		return url.Values{"id": {strconv.FormatInt(ids[0], 10)}, "token": {token}, "csrf": {csrf}, "operator": {"tester"}}
	}
	for _, tc := range []struct {
		name string
		form url.Values
		hdr  map[string]string
		want int
	}{
		{"no csrf", form(testToken, ""), nil, 403},
		{"wrong csrf", form(testToken, strings.Repeat("0", 64)), nil, 403},
		{"other origin", form(testToken, c.csrf), map[string]string{"Origin": "http://evil.example"}, 403},
		{"cross-site fetch", form(testToken, c.csrf), map[string]string{"Sec-Fetch-Site": "cross-site"}, 403},
		{"no token", form("", c.csrf), nil, 401},
		{"wrong token", form("guess", c.csrf), nil, 401},
	} {
		code, body := c.post("/outbox/drop", tc.form, tc.hdr)
		require.Equal(t, tc.want, code, "%s: %s", tc.name, body)
		_, err := outbox.GetRow(bu.ctx, bu.pool, ids[0])
		require.NoError(t, err, "%s: the row is still there", tc.name)
	}
	code, body := c.post("/outbox/drop", form(testToken, c.csrf), nil)
	require.Equal(t, http.StatusOK, code, body)
	_, err := outbox.GetRow(bu.ctx, bu.pool, ids[0])
	require.ErrorIs(t, err, outbox.ErrRowNotFound)
	code, body = c.post("/outbox/drop", form(testToken, c.csrf), nil)
	require.Equal(t, http.StatusConflict, code, "not parked any more: %s", body)

	// Retry with the Bearer header instead of the form's token.
	code, body = c.post("/outbox/retry", url.Values{"id": {strconv.FormatInt(ids[1], 10)}, "csrf": {c.csrf}},
		map[string]string{"Authorization": "Bearer " + testToken})
	require.Equal(t, http.StatusOK, code, body)
	r, err := outbox.GetRow(bu.ctx, bu.pool, ids[1])
	require.NoError(t, err)
	require.True(t, r.NextAttemptAt.IsZero(), "due now")
}

// TestReadOnlyAndNoToken: read-only hides and refuses every action; no
// token refuses them too.
func TestReadOnlyAndNoToken(t *testing.T) {
	for _, cfg := range []console.Config{{ReadOnly: true, Token: testToken}, {}} {
		bu := setup(t, "nats", cfg)
		ids := bu.enqueue(t, outbox.Event{Type: "job.idle", Destination: "idle", Body: []byte(`{}`)})
		park(t, bu, ids[0])
		bu.enqueue(t, outbox.Event{Type: "job.run", Body: []byte(`x`)})
		dead := bu.waitDead(t, 1)
		c := newClient(t, bu.base)
		q := url.QueryEscape(bu.queue)
		_, body, _ := c.get("/dlq/message?queue=" + q + "&id=" + dead[0].Message.ID)
		require.NotContains(t, body, "op=replay", "no action shown")
		_, body, _ = c.get("/outbox?state=parked")
		require.NotContains(t, body, "op=drop", "no action shown")
		if cfg.ReadOnly {
			code, _, _ := c.get("/dlq/confirm?op=purge&scope=all&queue=" + q)
			require.Equal(t, http.StatusForbidden, code)
		}
		code, body := c.post("/dlq/purge", url.Values{"queue": {bu.queue}, "scope": {"all"}, "csrf": {c.csrf}, "token": {testToken}}, nil)
		require.Equal(t, http.StatusForbidden, code, body)
		msgs, err := bu.dlq.List(bu.ctx, 0)
		require.NoError(t, err)
		require.Len(t, msgs, 1, "nothing purged")
	}
}

// TestDLQGroupReplayAndPurge: replay a group by its last error, purge
// all; the DLQ page shows the groups with their counts.
func TestDLQGroupReplayAndPurge(t *testing.T) {
	bu := setup(t, "nats", console.Config{Token: testToken})
	for range 3 {
		bu.enqueue(t, outbox.Event{Type: "job.run", Body: []byte(`{}`)})
	}
	bu.waitDead(t, 3)
	c := newClient(t, bu.base)
	q := url.QueryEscape(bu.queue)
	code, body, _ := c.get("/dlq?queue=" + q)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, ">3</a></td><td class=\"err\">handler refuses &lt;b&gt;this&lt;/b&gt; message N</td>", "three messages, each its id in its error: one cause")
	require.Equal(t, 1, strings.Count(body, "replay group"), "one group")
	require.Contains(t, body, "sample (message id, app id)")
	code, body, _ = c.get("/dlq/confirm?op=purge&scope=group&queue=" + q + "&reason=" + url.QueryEscape("handler refuses <b>this</b> message N"))
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "Purge 3 message(s)")
	code, body = c.post("/dlq/purge", url.Values{"queue": {bu.queue}, "scope": {"group"}, "reason": {"handler refuses <b>this</b> message N"},
		"csrf": {c.csrf}, "token": {testToken}, "operator": {"tester"}}, nil)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "3 message(s) purged")
	msgs, err := bu.dlq.List(bu.ctx, 0)
	require.NoError(t, err)
	require.Empty(t, msgs)
	code, body = c.post("/dlq/replay", url.Values{"queue": {bu.queue}, "scope": {"group"}, "reason": {"gone"}, "csrf": {c.csrf}, "token": {testToken}}, nil)
	require.Equal(t, http.StatusNotFound, code, body)
}

// TestReadingBeyondLoopbackNeedsToken: a client that is not on loopback
// reads only with the token; without a token set, not at all.
func TestReadingBeyondLoopbackNeedsToken(t *testing.T) {
	for _, token := range []string{testToken, ""} {
		bu := setup(t, "", console.Config{Token: token})
		h := bu.con
		req := httptest.NewRequest(http.MethodGet, "/ops/", nil).WithContext(context.Background())
		req.RemoteAddr = "192.0.2.7:40000"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if token == "" {
			require.Equal(t, http.StatusForbidden, rec.Code)
			continue
		}
		require.Equal(t, http.StatusUnauthorized, rec.Code)
		require.Contains(t, rec.Body.String(), `<a id="login" href="/ops/login">`, "the 401 page links to the login page")
		req.Header.Set("Authorization", "Bearer "+token)
		rec = httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		require.Equal(t, http.StatusOK, rec.Code)
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	_, err := console.New(console.Config{})
	require.ErrorIs(t, err, console.ErrInvalidConfig)
	bu := setup(t, "", console.Config{})
	_, err = console.New(console.Config{Pool: bu.pool, Prefix: "ops/"})
	require.ErrorIs(t, err, console.ErrInvalidConfig)
}

// TestOverviewDoesNotWaitForAColdDLQ: a DLQ read whole from the broker
// takes seconds for thousands of messages; the overview does not wait for
// its first reading past console's bound (0 here), says the DLQ is being
// read and leaves it out of api/overview, then shows the count once read.
func TestOverviewDoesNotWaitForAColdDLQ(t *testing.T) {
	defer console.SetOverviewWait(0)()
	bu := setup(t, "nats", console.Config{Token: testToken})
	for range 2 {
		bu.enqueue(t, outbox.Event{Type: "job.run", Body: []byte(`{}`)})
	}
	bu.waitDead(t, 2)
	c := newClient(t, bu.base)
	code, body, _ := c.get("/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "being read, shown on the next refresh")
	require.Eventually(t, func() bool {
		code, body, _ := c.get("/api/overview")
		return code == http.StatusOK && strings.Contains(body, `"dlq":{"`+bu.queue+`":2}`)
	}, 30*time.Second, 100*time.Millisecond)
	_, body, _ = c.get("/")
	require.NotContains(t, body, "being read")
	require.Contains(t, body, `data-live-dlq="`+bu.queue+`">2</td>`)
}
