package app_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/app"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// fields renders a request body from raw JSON member texts, in order.
func fields(members ...string) []byte {
	return []byte("{" + strings.Join(members, ",") + "}")
}

var validMembers = []string{`"user_id":"u-1"`, `"channel":"email"`, `"to":"a@example.com"`, `"subject":"hi"`, `"body":"hello"`}

// member returns validMembers with the member named name replaced by raw
// (or added when raw names another member).
func member(name, raw string) []byte {
	out := make([]string, 0, len(validMembers)+1)
	for _, m := range validMembers {
		if strings.HasPrefix(m, `"`+name+`":`) {
			continue
		}
		out = append(out, m)
	}
	return fields(append(out, raw)...)
}

// Requests a lenient parser would take with a guess (the last duplicate
// wins, a lone surrogate becomes U+FFFD) are refused, naming the field,
// and write nothing.
func TestStrictJSON(t *testing.T) {
	t.Parallel()
	b := setup(t, app.Config{})
	cases := []struct {
		name   string
		body   []byte
		status int
		field  string
		code   string
	}{
		{"duplicate to", fields(append(validMembers, `"to":"evil@example.com"`)...), 400, "to", app.CodeDuplicateField},
		{"duplicate via escape", fields(append(validMembers, `"t\u006f":"evil@example.com"`)...), 400, "to", app.CodeDuplicateField},
		{"duplicate null", fields(append(validMembers, `"subject":null`)...), 400, "subject", app.CodeDuplicateField},
		{"duplicate unknown", fields(append(validMembers, `"x":1`, `"x":2`)...), 400, "x", app.CodeDuplicateField},
		{"lone high surrogate", member("body", `"body":"a\ud800b"`), 422, "body", app.CodeInvalidUTF8},
		{"lone high surrogate at end", member("subject", `"subject":"hi \uD800"`), 422, "subject", app.CodeInvalidUTF8},
		{"lone low surrogate", member("user_id", `"user_id":"\udc00"`), 422, "user_id", app.CodeInvalidUTF8},
		{"high then non-surrogate", member("body", `"body":"\ud800\u0041"`), 422, "body", app.CodeInvalidUTF8},
		{"two high halves", member("body", `"body":"\ud83c\ud83c"`), 422, "body", app.CodeInvalidUTF8},
		{"reversed pair", member("to", `"to":"\udf89\ud83c@example.com"`), 422, "to", app.CodeInvalidUTF8},
		{"whitespace padding over the limit", []byte(string(member("body", `"body":"x"`)[:1]) + strings.Repeat(" ", 8<<20) + string(member("body", `"body":"x"`)[1:])), 413, "", app.CodeRequestTooLarge},
	}
	for _, c := range cases {
		r := b.post(t, c.body, nil)
		require.Equal(t, c.status, r.status, "%s: %s", c.name, r.raw)
		require.Equal(t, c.code, r.obj["code"], "%s: %s", c.name, r.raw)
		if c.field == "" {
			require.NotContains(t, r.obj, "field", "%s: %s", c.name, r.raw)
		} else {
			require.Equal(t, c.field, r.obj["field"], "%s: %s", c.name, r.raw)
		}
		n, e := b.counts(t)
		require.Zero(t, n+e, "%s wrote something", c.name)
	}
	// The 413 for the whole request says so, not that the body field is too long.
	r := b.post(t, cases[len(cases)-1].body, nil)
	require.Contains(t, r.obj["error"], "request is larger than")

	// Escapes that are text are still accepted: a real pair, and an escaped
	// backslash followed by "ud800" (the six characters \ud800).
	for _, body := range []string{`"body":"\ud83c\udf89"`, `"body":"\\ud800"`, `"body":"\\\ud83d\ude00\\"`} {
		r := b.post(t, member("body", body), nil)
		require.Equal(t, http.StatusCreated, r.status, "%s: %s", body, r.raw)
	}
	var got []string
	rows, err := b.pool.Query(context.Background(), `SELECT body FROM notifications ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		got = append(got, s)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"🎉", `\ud800`, `\😀\`}, got)
}

// Wrong methods get 405 with Allow; unknown paths 404; both in JSON.
func TestMethodNotAllowed(t *testing.T) {
	t.Parallel()
	b := setup(t, app.Config{})
	for _, c := range []struct{ method, path, allow string }{
		{http.MethodPut, "/notifications/1", "GET, HEAD"},
		{http.MethodDelete, "/notifications/1", "GET, HEAD"},
		{http.MethodPost, "/notifications/1", "GET, HEAD"},
		{http.MethodGet, "/notifications", "POST"},
		{http.MethodDelete, "/notifications", "POST"},
		{http.MethodPost, "/readyz", "GET, HEAD"},
	} {
		r := b.do(t, c.method, c.path, []byte(`{}`), nil)
		require.Equal(t, http.StatusMethodNotAllowed, r.status, "%s %s: %s", c.method, c.path, r.raw)
		require.Equal(t, app.CodeMethodNotAllowed, r.obj["code"])
		require.Equal(t, c.allow, r.header.Get("Allow"), "%s %s", c.method, c.path)
		require.NotEmpty(t, r.obj["error"])
	}
	for _, p := range []string{"/nope", "/notifications/1/x", "/"} {
		r := b.do(t, http.MethodGet, p, nil, nil)
		require.Equal(t, http.StatusNotFound, r.status, "%s: %s", p, r.raw)
		require.Equal(t, app.CodeNotFound, r.obj["code"])
	}
	n, e := b.counts(t)
	require.Zero(t, n+e)
}

// A body the API would misread is refused with 415 before it is read.
func TestUnsupportedMediaType(t *testing.T) {
	t.Parallel()
	b := setup(t, app.Config{})
	body := fields(validMembers...)
	for name, h := range map[string]map[string]string{
		"text/plain":        {"Content-Type": "text/plain"},
		"form":              {"Content-Type": "application/x-www-form-urlencoded"},
		"json-ish":          {"Content-Type": "application/jsonp"},
		"bad syntax":        {"Content-Type": "application/json; charset"},
		"latin1":            {"Content-Type": "application/json; charset=iso-8859-1"},
		"gzip":              {"Content-Encoding": "gzip"},
		"identity and gzip": {"Content-Encoding": "identity, gzip"},
	} {
		r := b.do(t, http.MethodPost, "/notifications", body, h)
		require.Equal(t, http.StatusUnsupportedMediaType, r.status, "%s: %s", name, r.raw)
		require.Equal(t, app.CodeUnsupportedMediaType, r.obj["code"], name)
	}
	n, e := b.counts(t)
	require.Zero(t, n+e)
	for name, h := range map[string]map[string]string{
		"params":          {"Content-Type": "application/json; charset=UTF-8"},
		"case":            {"Content-Type": "Application/JSON"},
		"identity":        {"Content-Encoding": "identity"},
		"no content type": {"Content-Type": ""},
	} {
		req, err := http.NewRequest(http.MethodPost, b.srv.URL+"/notifications", strings.NewReader(string(body)))
		require.NoError(t, err)
		for k, v := range h {
			if v != "" {
				req.Header.Set(k, v)
			}
		}
		res, err := b.srv.Client().Do(req)
		require.NoError(t, err)
		raw, _ := io.ReadAll(res.Body)
		res.Body.Close()
		require.Equal(t, http.StatusCreated, res.StatusCode, "%s: %s", name, raw)
	}
}

// rawRequest sends req as bytes (so headers go exactly as written) and
// returns the status and body.
func rawRequest(t *testing.T, srv *httptest.Server, req string) (int, map[string]any) {
	t.Helper()
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	c, err := net.Dial("tcp", u.Host)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(20*time.Second)))
	_, err = io.WriteString(c, req)
	require.NoError(t, err)
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	defer res.Body.Close()
	var obj map[string]any
	require.NoError(t, json.NewDecoder(res.Body).Decode(&obj))
	return res.StatusCode, obj
}

// An Idempotency-Key header that is present but empty is refused, not
// taken as "no key".
func TestEmptyIdempotencyKey(t *testing.T) {
	t.Parallel()
	b := setup(t, app.Config{})
	body := string(fields(validMembers...))
	for _, line := range []string{"Idempotency-Key:", "Idempotency-Key: ", "Idempotency-Key:   \t"} {
		status, obj := rawRequest(t, b.srv, "POST /notifications HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
			line+"\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\nConnection: close\r\n\r\n"+body)
		require.Equal(t, http.StatusBadRequest, status, "%q: %v", line, obj)
		require.Equal(t, app.CodeInvalidIdempotencyKey, obj["code"], "%q", line)
		require.Equal(t, "Idempotency-Key", obj["field"])
	}
	n, e := b.counts(t)
	require.Zero(t, n+e)
}

// Only the canonical decimal form names a notification: "+1", "01",
// "1.0" are not aliases of 1.
func TestCanonicalIDs(t *testing.T) {
	t.Parallel()
	b := setup(t, app.Config{})
	id := b.create(t, valid())
	require.Equal(t, "1", id)
	r := b.do(t, http.MethodGet, "/notifications/1", nil, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	for _, alias := range []string{"%2B1", "01", "001", "1.0", "0x1", "1e0", "%201", "1%20", "-0", "abc"} {
		r := b.do(t, http.MethodGet, "/notifications/"+alias, nil, nil)
		require.Equal(t, http.StatusNotFound, r.status, "%s: %s", alias, r.raw)
		require.Equal(t, app.CodeNotFound, r.obj["code"], alias)
		require.Equal(t, "id", r.obj["field"], alias)
	}
	_, err := b.app.Status(context.Background(), "+1")
	require.ErrorIs(t, err, app.ErrNotFound)
}

// /readyz never shows the database's error (user and database names) and
// says 503 while the schema is missing.
func TestReadyz(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A database that does not exist: the driver's error names it.
	u, err := url.Parse(testenv.DatabaseURL())
	require.NoError(t, err)
	u.Path = "/ferry_no_such_db_secret"
	pool, err := pgxpool.New(ctx, u.String())
	require.NoError(t, err)
	defer pool.Close()
	a, err := app.New(app.Config{Pool: pool})
	require.NoError(t, err)
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	res, err := http.Get(srv.URL + "/readyz")
	require.NoError(t, err)
	raw, _ := io.ReadAll(res.Body)
	res.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, res.StatusCode, "%s", raw)
	require.NotContains(t, string(raw), "ferry_no_such_db_secret")
	require.NotContains(t, string(raw), "ferry@", "no user name")
	require.NotContains(t, string(raw), `user=`)
	require.Contains(t, string(raw), "the database does not answer")
	require.Error(t, a.Ready(ctx))

	// A database without the schema: not ready until it is migrated.
	pool2, _ := testenv.NewPool(t)
	a2, err := app.New(app.Config{Pool: pool2})
	require.NoError(t, err)
	srv2 := httptest.NewServer(a2.Handler())
	defer srv2.Close()
	get := func() (int, string) {
		res, err := http.Get(srv2.URL + "/readyz")
		require.NoError(t, err)
		defer res.Body.Close()
		raw, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(raw)
	}
	status, body := get()
	require.Equal(t, http.StatusServiceUnavailable, status, body)
	require.Contains(t, body, `outbox migration version 0 of 3`)
	require.Contains(t, body, `ferry migrate`)
	require.ErrorIs(t, a2.Ready(ctx), app.ErrNoSchema)
	require.NoError(t, outbox.Migrate(ctx, pool2))
	status, body = get()
	require.Equal(t, http.StatusServiceUnavailable, status, body)
	require.Contains(t, body, `app migration version 0 of 1`)
	require.NoError(t, app.Migrate(ctx, pool2))
	status, body = get()
	require.Equal(t, http.StatusOK, status, body)
	require.NoError(t, app.CheckSchema(ctx, pool2))
	cur, latest, err := app.MigrationVersion(ctx, pool2)
	require.NoError(t, err)
	require.EqualValues(t, 1, cur)
	require.EqualValues(t, 1, latest)
}

// A request body that stalls past the server's read timeout gets 408, not
// a 400 "malformed JSON".
func TestStalledBodyIs408(t *testing.T) {
	t.Parallel()
	b := setup(t, app.Config{})
	srv := httptest.NewUnstartedServer(b.app.Handler())
	srv.Config.ReadTimeout = 300 * time.Millisecond
	srv.Start()
	defer srv.Close()
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	c, err := net.Dial("tcp", u.Host)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(20*time.Second)))
	_, err = io.WriteString(c, "POST /notifications HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"user_id\":")
	require.NoError(t, err)
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	defer res.Body.Close()
	var obj map[string]any
	require.NoError(t, json.NewDecoder(res.Body).Decode(&obj))
	require.Equal(t, http.StatusRequestTimeout, res.StatusCode, "%v", obj)
	require.Equal(t, app.CodeRequestTimeout, obj["code"])
}
