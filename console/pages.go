package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ferrymq/ferry/alert"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/dlq"
	"github.com/ferrymq/ferry/outbox"
)

// pageSize is the number of items of a list page.
const pageSize = 50

// maxGroups is the most causes the DLQ page lists (largest first); the
// rest are counted in one line, and the messages table below still finds
// them (filter by error).
const maxGroups = 50

var funcs = template.FuncMap{
	"text": text,
	"ts": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"age": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return dur(time.Since(t))
	},
	"dur": dur,
	"clip": func(s string, n int) string {
		s = text(s)
		r := []rune(s)
		if len(r) > n {
			return string(r[:n]) + "…"
		}
		return s
	},
	"add":   func(a, b int) int { return a + b },
	"q":     url.QueryEscape,
	"appid": dlq.AppID,
	"first": dlq.FirstFailed,
}

// text makes s fit to show: invalid UTF-8 becomes U+FFFD (html/template
// escapes the rest).
func text(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

func dur(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}

// body is a message body as the pages show it.
type body struct {
	Text    string
	Bytes   int
	JSON    bool
	BadUTF8 bool
}

func showBody(b []byte) body {
	out := body{Bytes: len(b), BadUTF8: !utf8.Valid(b)}
	var buf bytes.Buffer
	if json.Valid(b) && json.Indent(&buf, b, "", "  ") == nil {
		out.JSON, out.Text = true, buf.String()
	} else {
		out.Text = text(string(b))
	}
	return out
}

type header struct{ Name, Value string }

func headers(h map[string]string) []header {
	out := make([]header, 0, len(h))
	for k, v := range h {
		out = append(out, header{text(k), text(v)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// ---------------------------------------------------------------- overview

type queueSummary struct {
	Queue, Where string
	Dead         int
	ReadAt       time.Time
	Err          string
	// Reading: the DLQ's first reading is still under way (readingWithin).
	Reading bool
}

type bar struct {
	X, HP, YP, HH, YH, HD, YD int
	Label                     string
}

type overviewData struct {
	Stats                    outbox.Stats
	Estimated                bool
	Rates                    []outbox.RatePoint
	Bars                     []bar
	Published, Handled, Dead int64
	Peak                     int64
	Queues                   []queueSummary
	Alert                    string
	// WALSlots names the WAL relays' slots on this database: their rows
	// are deleted once published, which the page says.
	WALSlots   []string
	Figures    []Figure
	FiguresErr string
}

func (c *Console) overviewData(r *http.Request) (*overviewData, error) {
	ctx := r.Context()
	bl, err := outbox.ReadBacklog(ctx, c.cfg.Pool)
	if err != nil {
		return nil, err
	}
	rates, err := outbox.Rates(ctx, c.cfg.Pool, 15)
	if err != nil {
		return nil, err
	}
	d := &overviewData{Stats: bl.Stats, Estimated: bl.Estimated, Rates: rates}
	if d.Alert, err = c.alertState(ctx); err != nil {
		return nil, err
	}
	if d.WALSlots, err = c.walSlots(ctx); err != nil {
		return nil, err
	}
	if c.cfg.Figures != nil {
		if d.Figures, err = c.cfg.Figures(ctx); err != nil {
			d.FiguresErr = err.Error()
		}
	}
	for _, p := range rates {
		d.Published += p.Published
		d.Handled += p.Handled
		d.Dead += p.Dead
		d.Peak = max(d.Peak, p.Published, p.Handled, p.Dead)
	}
	// The chart: three bars per minute (published, handled,
	// dead-lettered), 100 px high at the peak.
	for i, p := range rates {
		b := bar{X: i * 40, Label: p.Minute.UTC().Format("15:04")}
		if d.Peak > 0 {
			b.HP, b.HH, b.HD = int(p.Published*100/d.Peak), int(p.Handled*100/d.Peak), int(p.Dead*100/d.Peak)
		}
		b.YP, b.YH, b.YD = 110-b.HP, 110-b.HH, 110-b.HD
		d.Bars = append(d.Bars, b)
	}
	for _, q := range c.cfg.Queues {
		var rd *dlqReading
		if r.URL.Query().Get("fresh") != "" {
			rd = c.reading(ctx, q, true)
		} else {
			rd = c.readingWithin(ctx, q, overviewWait)
		}
		if rd == nil {
			d.Queues = append(d.Queues, queueSummary{Queue: q, Reading: true})
			continue
		}
		s := queueSummary{Queue: q, Where: rd.where, Dead: len(rd.msgs), ReadAt: rd.at}
		if rd.err != nil {
			s.Err = rd.err.Error()
		}
		d.Queues = append(d.Queues, s)
	}
	return d, nil
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	d, err := c.overviewData(r)
	if err != nil {
		c.failErr(w, r, "reading the outbox", err)
		return
	}
	c.render(w, r, http.StatusOK, "overview", "Overview", d)
}

// apiOverview is the overview's figures as JSON, for the page's script:
// {"unprocessed": N, "oldest_ms": N, "scheduled": N, "parked": N,
// "published_15m": N, "handled_15m": N, "dead_15m": N, "dlq": {"queue": N}};
// a queue whose DLQ's first reading is still under way is left out of "dlq".
func (c *Console) apiOverview(w http.ResponseWriter, r *http.Request) {
	d, err := c.overviewData(r)
	if err != nil {
		c.failErr(w, r, "reading the outbox", err)
		return
	}
	dead := map[string]int{}
	for _, q := range d.Queues {
		if !q.Reading { // not counted yet: left out, not shown as 0
			dead[q.Queue] = q.Dead
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"unprocessed": d.Stats.Unprocessed, "oldest": dur(d.Stats.OldestUnprocessedAge), "scheduled": d.Stats.Scheduled,
		"parked": d.Stats.Parked, "estimated": d.Estimated, "published_15m": d.Published, "handled_15m": d.Handled, "dead_15m": d.Dead, "dlq": dead,
	})
}

// ---------------------------------------------------------------- outbox

type outboxData struct {
	State                                  outbox.RowState
	Type, Key, AppID, Error, MinAge, After string
	Page                                   outbox.RowPage
	Query                                  string // the filter as a query string, without after
}

func (c *Console) outboxPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d := outboxData{State: outbox.RowState(q.Get("state")), Type: q.Get("type"), Key: q.Get("key"), AppID: q.Get("app_id"),
		Error: q.Get("error"), MinAge: q.Get("min_age"), After: q.Get("after")}
	if d.State == "" {
		d.State = outbox.RowParked
	}
	f := outbox.RowFilter{State: d.State, Type: d.Type, Key: d.Key, AppID: d.AppID, ErrorContains: d.Error, Limit: pageSize}
	if d.MinAge != "" {
		age, err := time.ParseDuration(d.MinAge)
		if err != nil || age < 0 {
			c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("min_age %q: want a duration such as 10m or 2h", d.MinAge))
			return
		}
		f.MinAge = age
	}
	if d.After != "" {
		id, err := strconv.ParseInt(d.After, 10, 64)
		if err != nil || id < 0 {
			c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("after %q: want an outbox row id", d.After))
			return
		}
		f.AfterID = id
	}
	page, err := outbox.ListRows(r.Context(), c.cfg.Pool, f)
	if errors.Is(err, outbox.ErrInvalidConfig) {
		c.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	if err != nil {
		c.failErr(w, r, "reading the outbox", err)
		return
	}
	d.Page = page
	v := url.Values{"state": {string(d.State)}}
	for k, s := range map[string]string{"type": d.Type, "key": d.Key, "app_id": d.AppID, "error": d.Error, "min_age": d.MinAge} {
		if s != "" {
			v.Set(k, s)
		}
	}
	d.Query = v.Encode()
	c.render(w, r, http.StatusOK, "outbox", "Outbox", d)
}

func rowID(w http.ResponseWriter, r *http.Request, c *Console, s string) (int64, bool) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("id %q: want a positive outbox row id", s))
		return 0, false
	}
	return id, true
}

type rowData struct {
	Row     outbox.Row
	State   outbox.RowState
	Body    body
	Headers []header
}

func (c *Console) rowPage(w http.ResponseWriter, r *http.Request) {
	id, ok := rowID(w, r, c, r.URL.Query().Get("id"))
	if !ok {
		return
	}
	row, err := outbox.GetRow(r.Context(), c.cfg.Pool, id)
	if errors.Is(err, outbox.ErrRowNotFound) {
		c.fail(w, r, http.StatusNotFound, err.Error()+" (published rows are deleted after the relay's retention; see the story page)")
		return
	}
	if err != nil {
		c.failErr(w, r, "reading the outbox", err)
		return
	}
	c.render(w, r, http.StatusOK, "row", fmt.Sprintf("Outbox row %d", id), rowData{Row: row, State: row.State(), Body: showBody(row.Payload), Headers: headers(row.Headers)})
}

type confirmData struct {
	Action, What, Warning string
	Fields                map[string]string
	Count                 int
	Items                 []string
}

func (c *Console) outboxConfirm(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	op := q.Get("op")
	if op != "retry" && op != "drop" {
		c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("op %q: want retry or drop", op))
		return
	}
	id, ok := rowID(w, r, c, q.Get("id"))
	if !ok {
		return
	}
	if c.cfg.ReadOnly {
		c.fail(w, r, http.StatusForbidden, "the console is read-only (--console-read-only): no action is allowed")
		return
	}
	d := confirmData{Action: c.cfg.Prefix + "/outbox/" + op, Fields: map[string]string{"id": strconv.FormatInt(id, 10)}, Count: 1}
	if op == "retry" {
		d.What = fmt.Sprintf("Make parked row %d due now: the next claim of a relay publishes it.", id)
	} else {
		d.What = fmt.Sprintf("Drop parked row %d: its event is deleted and never published.", id)
		d.Warning = "This cannot be undone."
	}
	c.render(w, r, http.StatusOK, "confirm", "Confirm", d)
}

func (c *Console) outboxAction(w http.ResponseWriter, r *http.Request) {
	op := r.PathValue("op")
	if op != "retry" && op != "drop" {
		c.fail(w, r, http.StatusNotFound, fmt.Sprintf("no outbox action %q (retry, drop)", op))
		return
	}
	if !c.checkPost(w, r, false) {
		return
	}
	id, ok := rowID(w, r, c, r.PostFormValue("id"))
	if !ok {
		return
	}
	fn := outbox.RetryParked
	if op == "drop" {
		fn = outbox.DropParked
	}
	p, err := fn(r.Context(), c.cfg.Pool, id)
	if errors.Is(err, outbox.ErrNotParked) {
		c.fail(w, r, http.StatusConflict, err.Error())
		return
	}
	if err != nil {
		c.failErr(w, r, "outbox "+op, err)
		return
	}
	outbox.AuditParked(c.log, op, p, actor(r))
	verb := map[string]string{"retry": "made due now", "drop": "dropped"}[op]
	c.render(w, r, http.StatusOK, "done", "Done", struct{ Message, Back string }{
		fmt.Sprintf("Parked row %d (%s) %s.", p.ID, text(p.Type), verb), c.cfg.Prefix + "/outbox?state=parked"})
}

// ---------------------------------------------------------------- DLQ

type dlqData struct {
	Queues               []queueSummary
	Queue                string
	Where                string
	ReadAt               time.Time
	Err                  string
	Total                int
	Groups               []dlq.Group
	OtherGroups          int // the causes past maxGroups, not shown
	OtherMessages        int // their messages
	AppID, Error, Reason string
	HasReason            bool
	Match                []broker.DeadMessage
	Matched              int
	Offset, Next, Prev   int
	Filtered             bool
	Query                string
}

func (c *Console) dlqFilter(q url.Values) dlq.Filter {
	f := dlq.Filter{ErrorContains: q.Get("error")}
	if v := strings.TrimSpace(q.Get("app_id")); v != "" {
		f.AppIDs = []string{v}
	}
	if q.Has("reason") {
		f.Reason, f.HasReason = q.Get("reason"), true
	}
	return f
}

func (c *Console) dlqPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d := dlqData{Queue: q.Get("queue"), AppID: q.Get("app_id"), Error: q.Get("error"), Reason: q.Get("reason"), HasReason: q.Has("reason")}
	for _, name := range c.cfg.Queues {
		d.Queues = append(d.Queues, queueSummary{Queue: name})
	}
	if d.Queue == "" && len(c.cfg.Queues) > 0 {
		d.Queue = c.cfg.Queues[0]
	}
	if d.Queue == "" {
		c.render(w, r, http.StatusOK, "dlq", "DLQ", d)
		return
	}
	if _, err := c.dlq(d.Queue); err != nil && !errors.Is(err, broker.ErrUnknownQueue) {
		c.fail(w, r, http.StatusNotFound, err.Error())
		return
	}
	if v := q.Get("offset"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("offset %q: want 0 or more", v))
			return
		}
		d.Offset = n
	}
	rd := c.reading(r.Context(), d.Queue, q.Get("fresh") != "")
	d.Where, d.ReadAt, d.Total = rd.where, rd.at, len(rd.msgs)
	if rd.err != nil {
		d.Err = rd.err.Error()
	}
	d.Groups = rd.groups
	if len(d.Groups) > maxGroups {
		d.Groups = rd.groups[:maxGroups]
		for _, g := range rd.groups[maxGroups:] {
			d.OtherGroups++
			d.OtherMessages += g.Count
		}
	}
	f := c.dlqFilter(q)
	d.Filtered = !f.Empty()
	match := dlq.Match(rd.msgs, f)
	d.Matched = len(match)
	end := min(d.Offset+pageSize, len(match))
	if d.Offset < len(match) {
		d.Match = match[d.Offset:end]
	}
	if end < len(match) {
		d.Next = end
	}
	d.Prev = max(d.Offset-pageSize, 0)
	v := url.Values{"queue": {d.Queue}}
	if d.AppID != "" {
		v.Set("app_id", d.AppID)
	}
	if d.Error != "" {
		v.Set("error", d.Error)
	}
	if d.HasReason {
		v.Set("reason", d.Reason)
	}
	d.Query = v.Encode()
	c.render(w, r, http.StatusOK, "dlq", "DLQ "+d.Queue, d)
}

type messageData struct {
	Queue   string
	Msg     broker.DeadMessage
	AppID   string
	Body    body
	Headers []header
}

func (c *Console) findDead(w http.ResponseWriter, r *http.Request, queue, id string) (broker.DeadMessage, bool) {
	if _, err := c.dlq(queue); err != nil {
		c.fail(w, r, http.StatusNotFound, err.Error())
		return broker.DeadMessage{}, false
	}
	rd := c.reading(r.Context(), queue, false)
	if rd.err != nil {
		c.failErr(w, r, "reading the DLQ of "+queue, rd.err)
		return broker.DeadMessage{}, false
	}
	ms := dlq.Pick(rd.msgs, []string{id})
	if len(ms) == 0 {
		// It may have arrived since the reading.
		rd = c.reading(r.Context(), queue, true)
		ms = dlq.Pick(rd.msgs, []string{id})
	}
	if len(ms) == 0 {
		c.fail(w, r, http.StatusNotFound, fmt.Sprintf("no message %q in the DLQ of %s (replayed or purged?)", text(id), queue))
		return broker.DeadMessage{}, false
	}
	return ms[0], true
}

func (c *Console) messagePage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	m, ok := c.findDead(w, r, q.Get("queue"), q.Get("id"))
	if !ok {
		return
	}
	c.render(w, r, http.StatusOK, "message", "Dead message "+m.Message.ID, messageData{Queue: q.Get("queue"), Msg: m, AppID: dlq.AppID(m),
		Body: showBody(m.Message.Body), Headers: headers(m.Message.Headers)})
}

// selection is what a DLQ action acts on: scope one (id), group (reason)
// or all; nil ids means every message.
func (c *Console) selection(w http.ResponseWriter, r *http.Request, v url.Values) (queue, scope string, ids []string, ok bool) {
	queue, scope = v.Get("queue"), v.Get("scope")
	if _, err := c.dlq(queue); err != nil {
		c.fail(w, r, http.StatusNotFound, err.Error())
		return "", "", nil, false
	}
	switch scope {
	case "one":
		id := v.Get("id")
		if id == "" {
			c.fail(w, r, http.StatusBadRequest, "scope one needs the message id (id)")
			return "", "", nil, false
		}
		return queue, scope, []string{id}, true
	case "group":
		if !v.Has("reason") {
			c.fail(w, r, http.StatusBadRequest, "scope group needs the group's last error (reason)")
			return "", "", nil, false
		}
		rd := c.reading(r.Context(), queue, true)
		if rd.err != nil {
			c.failErr(w, r, "reading the DLQ of "+queue, rd.err)
			return "", "", nil, false
		}
		ids = dlq.IDs(dlq.Match(rd.msgs, dlq.Filter{Reason: v.Get("reason"), HasReason: true}))
		if len(ids) == 0 {
			c.fail(w, r, http.StatusNotFound, "no message with that last error in the DLQ of "+queue)
			return "", "", nil, false
		}
		return queue, scope, ids, true
	case "all":
		return queue, scope, nil, true
	}
	c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("scope %q: want one, group or all", scope))
	return "", "", nil, false
}

func (c *Console) dlqConfirm(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	op := q.Get("op")
	if op != "replay" && op != "purge" {
		c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("op %q: want replay or purge", op))
		return
	}
	if c.cfg.ReadOnly {
		c.fail(w, r, http.StatusForbidden, "the console is read-only (--console-read-only): no action is allowed")
		return
	}
	queue, scope, ids, ok := c.selection(w, r, q)
	if !ok {
		return
	}
	d := confirmData{Action: c.cfg.Prefix + "/dlq/" + op, Fields: map[string]string{"queue": queue, "scope": scope}}
	rd := c.reading(r.Context(), queue, true)
	n := len(dlq.Pick(rd.msgs, ids))
	d.Count = n
	for _, m := range dlq.Pick(rd.msgs, ids) {
		if len(d.Items) == 20 {
			break
		}
		d.Items = append(d.Items, m.Message.ID+" "+text(dlq.AppID(m))+" "+text(m.Message.Type))
	}
	switch scope {
	case "one":
		d.Fields["id"] = ids[0]
	case "group":
		d.Fields["reason"] = q.Get("reason")
	}
	if op == "replay" {
		d.What = fmt.Sprintf("Replay %d message(s) from the DLQ of %s back to %s, with their retry count reset.", n, queue, queue)
	} else {
		d.What = fmt.Sprintf("Purge %d message(s) from the DLQ of %s: they are deleted for good.", n, queue)
		d.Warning = "This cannot be undone."
	}
	if scope == "all" {
		d.Warning += " Every message in the DLQ, also those dead-lettered after this page was shown."
	}
	c.render(w, r, http.StatusOK, "confirm", "Confirm", d)
}

func (c *Console) dlqAction(w http.ResponseWriter, r *http.Request) {
	op := r.PathValue("op")
	if op != "replay" && op != "purge" {
		c.fail(w, r, http.StatusNotFound, fmt.Sprintf("no DLQ action %q (replay, purge)", op))
		return
	}
	if !c.checkPost(w, r, false) {
		return
	}
	queue, _, ids, ok := c.selection(w, r, r.PostForm)
	if !ok {
		return
	}
	d, _ := c.dlq(queue)
	a := dlq.Actor{By: actor(r), Log: c.log}
	var done []string
	var err error
	if op == "replay" {
		done, err = dlq.Replay(r.Context(), d, queue, ids, a)
	} else {
		done, err = dlq.Purge(r.Context(), d, queue, ids, a)
	}
	c.forget(queue)
	verb := map[string]string{"replay": "replayed", "purge": "purged"}[op]
	if err != nil {
		c.failErr(w, r, fmt.Sprintf("dlq %s: %d %s before the error", op, len(done), verb), err)
		return
	}
	msg := fmt.Sprintf("%d message(s) %s from the DLQ of %s.", len(done), verb, queue)
	if missing := dlq.Missing(ids, done); len(missing) > 0 {
		msg += fmt.Sprintf(" %d were no longer in the DLQ: %s.", len(missing), text(strings.Join(missing, ", ")))
	}
	c.render(w, r, http.StatusOK, "done", "Done", struct{ Message, Back string }{msg, c.cfg.Prefix + "/dlq?queue=" + url.QueryEscape(queue)})
}

// ---------------------------------------------------------------- story

type storyData struct {
	Q    string
	Jobs []outbox.Job
	Err  string
}

func (c *Console) storyPage(w http.ResponseWriter, r *http.Request) {
	q := strings.TrimSpace(r.URL.Query().Get("q"))
	d := storyData{Q: q}
	if q != "" {
		ctx := r.Context()
		if id, err := strconv.ParseInt(q, 10, 64); err == nil && id > 0 {
			if j, err := outbox.JobGet(ctx, c.cfg.Pool, id); err == nil {
				d.Jobs = append(d.Jobs, j)
			} else if !errors.Is(err, outbox.ErrJobNotFound) {
				c.failErr(w, r, "reading the job", err)
				return
			}
		}
		jobs, err := outbox.JobGetByAppID(ctx, c.cfg.Pool, q)
		if err != nil && !errors.Is(err, outbox.ErrJobNotFound) {
			c.failErr(w, r, "reading the jobs", err)
			return
		}
		for _, j := range jobs {
			if len(d.Jobs) == 0 || d.Jobs[0].ID != j.ID {
				d.Jobs = append(d.Jobs, j)
			}
		}
		if len(d.Jobs) == 0 {
			d.Err = fmt.Sprintf("no job has the message id or app id %q (rows deleted by the relay's retention are not searched)", q)
			if slots, err := c.walSlots(ctx); err == nil && len(slots) > 0 {
				d.Err = fmt.Sprintf("no job has the message id or app id %q (a WAL relay runs here: it deletes each row once the broker confirms it, so only the rows still in the outbox, those published by the polling side and the workers' records are searched)", q)
			}
		}
	}
	c.render(w, r, http.StatusOK, "story", "Story", d)
}

// ---------------------------------------------------------------- login

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "login", "Log in", nil)
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if !c.checkPost(w, r, true) {
		return
	}
	if c.cfg.Token == "" {
		c.fail(w, r, http.StatusForbidden, "no console token is set (--console-token): there is nothing to log in with")
		return
	}
	if !c.tokenOK(r, r.PostFormValue("token")) {
		c.fail(w, r, http.StatusUnauthorized, "wrong token")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: c.cfg.Token, Path: c.cfg.Prefix + "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil, MaxAge: 12 * 3600})
	http.Redirect(w, r, c.cfg.Prefix+"/", http.StatusSeeOther)
}

// alertState describes the stuck-outbox alert: the state of Config.Alert
// when this process runs it, else the state its leader (a relay or run on
// this database) last stored in ferry_alerts, with when.
func (c *Console) alertState(ctx context.Context) (string, error) {
	if c.cfg.Alert != nil {
		return c.cfg.Alert.State().String() + " (run by this process)", nil
	}
	st, found, err := alert.ReadStored(ctx, c.cfg.Pool, "")
	if err != nil {
		return "", err
	}
	lead := "a relay on this database leads the alert"
	if !st.Leader {
		poll, wal, err := outbox.RunningRelays(ctx, c.cfg.Pool)
		if err != nil {
			return "", err
		}
		switch n := poll + wal; n {
		case 0:
			lead = "no relay runs on this database now"
		default:
			lead = fmt.Sprintf("%d relay(s) run on this database, none with the alert: give one --alert-threshold", n)
		}
	}
	if !found {
		if st.Leader {
			return "inactive (" + lead + "; the backlog has not gone above its threshold)", nil
		}
		return "not run: " + lead, nil
	}
	s := st.State.String()
	if st.State != alert.Inactive && !st.Since.IsZero() {
		s += ", backlog above the threshold since " + st.Since.UTC().Format("2006-01-02 15:04:05 UTC")
	}
	s += " (" + lead + ")"
	return s + "; stored by the alert's leader at " + st.UpdatedAt.UTC().Format("2006-01-02 15:04:05 UTC"), nil
}

// walSlots returns the slot names of the WAL relays registered on the
// database (outbox.ListWALStats), none when no relay ran in WAL mode.
func (c *Console) walSlots(ctx context.Context) ([]string, error) {
	ws, err := outbox.ListWALStats(ctx, c.cfg.Pool)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, w := range ws {
		names = append(names, w.Slot)
	}
	return names, nil
}
