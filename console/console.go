package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferrymq/ferry/alert"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/dlq"
)

// ErrInvalidConfig is wrapped by New's errors about its Config.
var ErrInvalidConfig = errors.New("console: invalid config")

// DefaultDLQCacheTTL is Config.DLQCacheTTL's default.
const DefaultDLQCacheTTL = 5 * time.Second

// Config configures a console. Zero fields mean the documented default.
type Config struct {
	// Pool is the database of the outbox and the workers' records;
	// required.
	Pool *pgxpool.Pool
	// Broker gives the DLQs of Queues (broker.Broker.DLQ); nil: the DLQ
	// pages say no broker is connected.
	Broker broker.Broker
	// BrokerName labels the broker on the pages, e.g. "rabbitmq".
	BrokerName string
	// Exchange labels where the events are published, e.g.
	// "notifications".
	Exchange string
	// Queues are the work queues whose DLQs are shown (their DLQ is
	// broker.DLQName(queue)).
	Queues []string
	// Token is the token every action needs (ferry's --console-token);
	// empty: every action is refused with 403, reading works from
	// loopback only.
	Token string
	// ReadOnly hides every action and refuses every POST with 403.
	ReadOnly bool
	// Prefix is the path the console is mounted under, e.g. "/ops"
	// (no trailing slash); empty mounts it at "/". Requests whose path
	// is outside it get 404.
	Prefix string
	// Alert, when set, is the stuck-outbox alert whose state the
	// overview shows; when nil the overview shows the state the alert's
	// leader on Pool's database last stored (alert.ReadStored).
	Alert *alert.Alert
	// Figures, when set, adds the application's own figures to the
	// overview (e.g. the notification service's sent, rejected and dead
	// counts); an error is shown in their place.
	Figures func(ctx context.Context) ([]Figure, error)
	// Logger receives the audit lines of the actions and the errors;
	// nil discards them.
	Logger *slog.Logger
	// DLQCacheTTL is how long a DLQ reading is served as it is (the DLQ
	// is read whole from the broker); an older one is served while the
	// DLQ is read again in the background. Defaults to 5 s
	// (DefaultDLQCacheTTL).
	DLQCacheTTL time.Duration
}

//go:embed templates/*.html
var templateFiles embed.FS

//go:embed static
var staticFiles embed.FS

// Figure is one of the application's figures on the overview.
type Figure struct {
	// Label names it, e.g. "sent"; Value is the number; Note says more,
	// e.g. "by reason: 12 invalid email".
	Label string
	Value int64
	Note  string
}

// Console is the console's http.Handler; New makes one. Safe for
// concurrent use.
type Console struct {
	cfg    Config
	log    *slog.Logger
	pages  map[string]*template.Template
	static http.Handler
	mux    *http.ServeMux

	mu    sync.Mutex
	dlqs  map[string]broker.DeadLetterQueue
	cache map[string]*dlqReading
	reads map[string]bool      // background readings under way
	acted map[string]time.Time // when an action last changed a DLQ
}

// dlqReading is one reading of a DLQ, kept Config.DLQCacheTTL.
type dlqReading struct {
	msgs   []broker.DeadMessage
	groups []dlq.Group // msgs grouped by last error
	where  string
	at     time.Time
	err    error
}

// New returns the console of cfg. It returns an error wrapping
// ErrInvalidConfig for a nil Pool, a Prefix not starting with "/" or
// ending with one, or a negative DLQCacheTTL.
func New(cfg Config) (*Console, error) {
	if cfg.Pool == nil {
		return nil, fmt.Errorf("%w: Pool is nil", ErrInvalidConfig)
	}
	if cfg.Prefix != "" && (!strings.HasPrefix(cfg.Prefix, "/") || strings.HasSuffix(cfg.Prefix, "/")) {
		return nil, fmt.Errorf("%w: Prefix %q: want a path like /ops, without a trailing slash", ErrInvalidConfig, cfg.Prefix)
	}
	if cfg.DLQCacheTTL < 0 {
		return nil, fmt.Errorf("%w: DLQCacheTTL %v: must not be negative", ErrInvalidConfig, cfg.DLQCacheTTL)
	}
	if cfg.DLQCacheTTL == 0 {
		cfg.DLQCacheTTL = DefaultDLQCacheTTL
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Console{cfg: cfg, log: log, pages: map[string]*template.Template{},
		dlqs: map[string]broker.DeadLetterQueue{}, cache: map[string]*dlqReading{}, reads: map[string]bool{}, acted: map[string]time.Time{}}
	for _, p := range []string{"overview", "outbox", "row", "dlq", "message", "confirm", "done", "story", "error", "login", "workflows", "workflow", "limits"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFiles, "templates/layout.html", "templates/"+p+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", p, err)
		}
		c.pages[p] = t
	}
	sub, err := fs.Sub(staticFiles, "static")
	if err != nil {
		return nil, fmt.Errorf("console: static: %w", err)
	}
	c.static = http.StripPrefix(cfg.Prefix+"/static/", http.FileServerFS(sub))
	m := http.NewServeMux()
	p := cfg.Prefix
	m.HandleFunc("GET "+p+"/{$}", c.overview)
	m.HandleFunc("GET "+p+"/api/overview", c.apiOverview)
	m.HandleFunc("GET "+p+"/outbox", c.outboxPage)
	m.HandleFunc("GET "+p+"/outbox/row", c.rowPage)
	m.HandleFunc("GET "+p+"/outbox/confirm", c.outboxConfirm)
	m.HandleFunc("POST "+p+"/outbox/{op}", c.outboxAction)
	m.HandleFunc("GET "+p+"/dlq", c.dlqPage)
	m.HandleFunc("GET "+p+"/dlq/message", c.messagePage)
	m.HandleFunc("GET "+p+"/dlq/confirm", c.dlqConfirm)
	m.HandleFunc("POST "+p+"/dlq/{op}", c.dlqAction)
	m.HandleFunc("GET "+p+"/story", c.storyPage)
	m.HandleFunc("GET "+p+"/workflows", c.workflowsPage)
	m.HandleFunc("GET "+p+"/workflow", c.workflowPage)
	m.HandleFunc("GET "+p+"/limits", c.limitsPage)
	m.HandleFunc("GET "+p+"/api/limits", c.apiLimits)
	m.HandleFunc("GET "+p+"/login", c.loginPage)
	m.HandleFunc("POST "+p+"/login", c.login)
	m.Handle("GET "+p+"/static/", c.static)
	c.mux = m
	return c, nil
}

// Handler is New for callers that want only the http.Handler.
func Handler(cfg Config) (http.Handler, error) { return New(cfg) }

const (
	csrfCookie  = "ferry_console_csrf"
	tokenCookie = "ferry_console_token"
	// csp: no inline script or style, nothing from elsewhere, no framing.
	csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
		"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

// ServeHTTP serves the console's pages, its JSON and its assets.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", csp)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin") // no-referrer would make the browser send Origin: null on the forms
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	if r.URL.Path == c.cfg.Prefix {
		http.Redirect(w, r, c.cfg.Prefix+"/", http.StatusFound)
		return
	}
	if !strings.HasPrefix(r.URL.Path, c.cfg.Prefix+"/static/") && r.URL.Path != c.cfg.Prefix+"/login" && !c.mayRead(r) {
		if c.cfg.Token == "" {
			c.fail(w, r, http.StatusForbidden, "reading the console from a client other than loopback needs a token, and none is set (--console-token)")
			return
		}
		c.fail(w, r, http.StatusUnauthorized, "reading the console from a client other than loopback needs the token: log in at "+c.cfg.Prefix+"/login")
		return
	}
	if r.Method == http.MethodGet {
		h.Set("Cache-Control", "no-store")
	}
	c.mux.ServeHTTP(w, r)
}

// mayRead: loopback clients read freely; others need the token.
func (c *Console) mayRead(r *http.Request) bool {
	return isLoopback(r.RemoteAddr) || c.tokenOK(r, "")
}

func isLoopback(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// tokenOK reports whether r carries the token: the form value given, the
// Authorization: Bearer header, or the login cookie.
func (c *Console) tokenOK(r *http.Request, form string) bool {
	if c.cfg.Token == "" {
		return false
	}
	eq := func(s string) bool { return s != "" && subtle.ConstantTimeCompare([]byte(s), []byte(c.cfg.Token)) == 1 }
	if eq(form) {
		return true
	}
	if a := r.Header.Get("Authorization"); strings.HasPrefix(a, "Bearer ") && eq(strings.TrimPrefix(a, "Bearer ")) {
		return true
	}
	if ck, err := r.Cookie(tokenCookie); err == nil && eq(ck.Value) {
		return true
	}
	return false
}

// csrf returns the CSRF token of r's browser, setting the cookie when it
// has none.
func (c *Console) csrf(w http.ResponseWriter, r *http.Request) string {
	if ck, err := r.Cookie(csrfCookie); err == nil && len(ck.Value) == 64 {
		return ck.Value
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	v := hex.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: v, Path: c.cfg.Prefix + "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	return v
}

// checkPost refuses a POST that is not a same-origin form of this console
// with the right CSRF token and, unless login is set, the token. It
// writes the refusal and returns false.
func (c *Console) checkPost(w http.ResponseWriter, r *http.Request, login bool) bool {
	if c.cfg.ReadOnly && !login {
		c.fail(w, r, http.StatusForbidden, "the console is read-only (--console-read-only): no action is allowed")
		return false
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		c.fail(w, r, http.StatusBadRequest, "the form could not be read: "+err.Error())
		return false
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		c.fail(w, r, http.StatusForbidden, "cross-site request refused (Sec-Fetch-Site: "+site+")")
		return false
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			c.fail(w, r, http.StatusForbidden, "cross-origin request refused (Origin: "+o+")")
			return false
		}
	}
	ck, err := r.Cookie(csrfCookie)
	if err != nil || ck.Value == "" || subtle.ConstantTimeCompare([]byte(ck.Value), []byte(r.PostFormValue("csrf"))) != 1 {
		c.fail(w, r, http.StatusForbidden, "missing or wrong CSRF token: reload the page and submit its form again")
		return false
	}
	if login {
		return true
	}
	if c.cfg.Token == "" {
		c.fail(w, r, http.StatusForbidden, "actions are off: no console token is set (--console-token or FERRY_CONSOLE_TOKEN)")
		return false
	}
	if !c.tokenOK(r, r.PostFormValue("token")) {
		c.fail(w, r, http.StatusUnauthorized, "this action needs the console token: missing or wrong")
		return false
	}
	return true
}

// actor names who acts, for the audit lines: the operator's name from
// the form and the client's address.
func actor(r *http.Request) string {
	name := strings.TrimSpace(r.PostFormValue("operator"))
	if name == "" {
		name = "unnamed"
	}
	name = strings.ToValidUTF8(name, "?")
	if len(name) > 64 {
		name = name[:64]
	}
	return name + " via console from " + r.RemoteAddr
}

// page is what every template gets.
type page struct {
	Base     string
	Title    string
	Nav      string
	CSRF     string
	ReadOnly bool
	Actions  bool // actions are shown: not read-only and a token is set
	Broker   string
	Exchange string
	Now      time.Time
	Data     any
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name, title string, data any) {
	p := page{Base: c.cfg.Prefix, Title: title, Nav: name, CSRF: c.csrf(w, r), ReadOnly: c.cfg.ReadOnly,
		Actions: !c.cfg.ReadOnly && c.cfg.Token != "", Broker: c.cfg.BrokerName, Exchange: c.cfg.Exchange, Now: time.Now(), Data: data}
	var buf strings.Builder
	if err := c.pages[name].Execute(&buf, p); err != nil {
		c.log.Error("console: rendering", "page", name, "error", err)
		http.Error(w, "console: rendering the page failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(buf.String()))
}

// fail answers with status and the reason: JSON for the api/ paths and
// clients that ask for it, a page otherwise.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, status int, reason string) {
	if strings.HasPrefix(r.URL.Path, c.cfg.Prefix+"/api/") || strings.Contains(r.Header.Get("Accept"), "application/json") {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": reason})
		return
	}
	c.render(w, r, status, "error", http.StatusText(status), struct {
		Status int
		Reason string
	}{status, reason})
}

// failErr answers a failed read or action: 504 for a context deadline,
// 502 for the broker's and the database's errors.
func (c *Console) failErr(w http.ResponseWriter, r *http.Request, what string, err error) {
	c.log.Warn("console: "+what, "error", err)
	status := http.StatusBadGateway
	if errors.Is(err, context.DeadlineExceeded) {
		status = http.StatusGatewayTimeout
	}
	c.fail(w, r, status, what+": "+err.Error())
}

// dlq returns the DLQ of queue, which must be one of Config.Queues.
func (c *Console) dlq(queue string) (broker.DeadLetterQueue, error) {
	known := false
	for _, q := range c.cfg.Queues {
		known = known || q == queue
	}
	if !known {
		return nil, fmt.Errorf("console: queue %q is not one the console shows (%s)", queue, strings.Join(c.cfg.Queues, ", "))
	}
	if c.cfg.Broker == nil {
		return nil, errors.New("console: no broker is connected")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if d, ok := c.dlqs[queue]; ok {
		return d, nil
	}
	d, err := c.cfg.Broker.DLQ(queue)
	if err != nil {
		return nil, err
	}
	c.dlqs[queue] = d
	return d, nil
}

// reading returns the DLQ of queue as last read. A reading older than
// DLQCacheTTL is returned as it is while one goroutine reads the DLQ
// again in the background (a DLQ is read whole from the broker, seconds
// for thousands of messages); the first reading, and one asked for with
// fresh, is waited for.
func (c *Console) reading(ctx context.Context, queue string, fresh bool) *dlqReading {
	c.mu.Lock()
	rd := c.cache[queue]
	c.mu.Unlock()
	switch {
	case rd != nil && !fresh && time.Since(rd.at) < c.cfg.DLQCacheTTL:
		return rd
	case rd != nil && !fresh:
		c.refresh(context.WithoutCancel(ctx), queue, true)
		return rd
	}
	return c.refresh(ctx, queue, false)
}

// overviewWait is how long the overview waits for a DLQ's first reading
// (none kept yet) before it shows the queue as being read: reading a DLQ
// of 10,000 messages from NATS takes about 60 ms (BenchmarkPagesOnBigBacklog),
// but a broker's DLQ may be larger or slower to read, and the overview
// answers within 200 ms. A variable for the tests.
var overviewWait = 100 * time.Millisecond

// readingWithin is reading for the overview: with a reading of queue kept
// (of any age) it is reading's; without one it starts the read in the
// background and waits for it at most wait, and returns nil when it is not
// done by then (the page says the DLQ is being read, and the next refresh
// shows it).
func (c *Console) readingWithin(ctx context.Context, queue string, wait time.Duration) *dlqReading {
	c.mu.Lock()
	rd := c.cache[queue]
	c.mu.Unlock()
	if rd != nil {
		return c.reading(ctx, queue, false)
	}
	c.refresh(context.WithoutCancel(ctx), queue, true)
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-deadline.C:
			return nil
		case <-tick.C:
			c.mu.Lock()
			rd = c.cache[queue]
			c.mu.Unlock()
			if rd != nil {
				return rd
			}
		}
	}
}

// refresh reads the DLQ of queue and keeps the reading; in background,
// it starts the read unless one is under way and returns nil.
func (c *Console) refresh(ctx context.Context, queue string, background bool) *dlqReading {
	if background {
		c.mu.Lock()
		busy := c.reads[queue]
		c.reads[queue] = true
		c.mu.Unlock()
		if busy {
			return nil
		}
		go func() {
			rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			c.refresh(rctx, queue, false)
			c.mu.Lock()
			delete(c.reads, queue)
			c.mu.Unlock()
		}()
		return nil
	}
	rd := &dlqReading{at: time.Now()}
	d, err := c.dlq(queue)
	if err == nil {
		rd.msgs, err = d.List(ctx, 0)
	}
	if err == nil {
		rd.where, _ = d.Where(ctx)
		rd.groups = dlq.GroupByReason(rd.msgs)
	}
	rd.err = err
	c.mu.Lock()
	// A reading begun before an action changed the DLQ is not kept.
	if rd.at.After(c.acted[queue]) {
		c.cache[queue] = rd
	}
	c.mu.Unlock()
	return rd
}

// forget drops the reading of queue, after an action changed it.
func (c *Console) forget(queue string) {
	c.mu.Lock()
	delete(c.cache, queue)
	c.acted[queue] = time.Now()
	c.mu.Unlock()
}
