package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/broker"
)

// RequestedEvent is the JSON body of an EventNotificationRequested event.
type RequestedEvent struct {
	// NotificationID is the notification's id, a decimal string.
	NotificationID string `json:"notification_id"`
	// UserID is the notification's user_id (also the event's partition key).
	UserID string `json:"user_id"`
	// Channel is the notification's channel ("email").
	Channel string `json:"channel"`
}

// Created is the body of a 201 answer to POST /notifications.
type Created struct {
	// ID is the notification id, a decimal string.
	ID string `json:"id"`
	// Status is "pending" for a new notification; a repeat with the same
	// Idempotency-Key gets the same ID and the notification's current
	// status (pending, sent or dead).
	Status string `json:"status"`
}

// Handler returns the HTTP API:
//
//	POST /notifications       201 Created; 400/413/415/422 with an APIError body for bad
//	                          input; 503 unavailable when the database is down
//	GET  /notifications/{id}  200 Notification; 404 APIError; 503 unavailable when the
//	                          database is down
//	GET  /healthz             200 {"status":"ok"} while the process runs
//	GET  /readyz              200 {"status":"ok"}; 503 {"status":"unavailable","error":...}
//	                          when the database does not answer or lacks the schema
//
// Every answer is JSON, including 404 for an unknown path and 405 (with
// an Allow header) for a known path with another method. Ids are decimal
// strings.
func (a *App) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /notifications", a.handleCreate)
	mux.HandleFunc("GET /notifications/{id}", a.handleGet)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", a.handleReady)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(r)
		if pattern != "" {
			mux.ServeHTTP(w, r) // sets the path values
			return
		}
		// No route: the mux's own answer is a plain-text 404 or 405 (or a
		// redirect to a cleaned path). Keep its status and headers (Allow,
		// Location), answer in JSON.
		rec := &headerRecorder{header: http.Header{}}
		h.ServeHTTP(rec, r)
		for _, k := range []string{"Allow", "Location"} {
			if v := rec.header.Values(k); len(v) > 0 {
				w.Header()[k] = v
			}
		}
		switch rec.status {
		case http.StatusMethodNotAllowed:
			writeJSON(w, rec.status, &APIError{Code: CodeMethodNotAllowed,
				Message: "method " + r.Method + " is not allowed on " + clip(r.URL.Path) + "; allowed: " + rec.header.Get("Allow")})
		case http.StatusNotFound, 0:
			writeJSON(w, http.StatusNotFound, &APIError{Code: CodeNotFound, Message: "no such endpoint: " + r.Method + " " + clip(r.URL.Path)})
		default:
			writeJSON(w, rec.status, map[string]string{"status": http.StatusText(rec.status)})
		}
	})
}

// headerRecorder records the status and headers of the mux's 404, 405
// and redirect answers and discards their text body.
type headerRecorder struct {
	header http.Header
	status int
}

func (h *headerRecorder) Header() http.Header { return h.header }
func (h *headerRecorder) Write(b []byte) (int, error) {
	if h.status == 0 {
		h.status = http.StatusOK
	}
	return len(b), nil
}
func (h *headerRecorder) WriteHeader(status int) {
	if h.status == 0 {
		h.status = status
	}
}

// requestLimit is the largest HTTP request body read: a maximal body field
// with every character escaped as \u00XX, plus room for the other fields.
func (a *App) requestLimit() int64 { return 6*int64(a.cfg.MaxBodyBytes) + 64<<10 }

func (a *App) handleCreate(w http.ResponseWriter, r *http.Request) {
	if e := checkMediaType(r.Header); e != nil {
		writeJSON(w, e.Status, e)
		return
	}
	key, e := checkIdempotencyKey(r.Header.Values("Idempotency-Key"))
	if e != nil {
		writeJSON(w, e.Status, e)
		return
	}
	limit := a.requestLimit()
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		var ne net.Error
		switch {
		case errors.As(err, &mbe):
			writeJSON(w, http.StatusRequestEntityTooLarge, apiErr(http.StatusRequestEntityTooLarge, "", CodeRequestTooLarge,
				"the request is larger than %d bytes, the limit for a whole request (the body field alone may have %d bytes); nothing was read",
				limit, a.cfg.MaxBodyBytes))
		case errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
			w.Header().Set("Connection", "close")
			writeJSON(w, http.StatusRequestTimeout, apiErr(http.StatusRequestTimeout, "", CodeRequestTimeout,
				"the request body did not arrive in time; nothing was written"))
		default:
			writeJSON(w, http.StatusBadRequest, apiErr(http.StatusBadRequest, "", CodeMalformedJSON, "reading the request body: %v", err))
		}
		return
	}
	req, e := ParseRequest(data, a.cfg.MaxBodyBytes)
	if e != nil {
		writeJSON(w, e.Status, e)
		return
	}
	res, e := a.create(r.Context(), req, key, r.Header.Get(broker.HeaderTraceparent))
	if e != nil {
		if e.Status >= 500 {
			a.log.Error("app: POST /notifications failed", "code", e.Code, "error", e.Message)
		}
		writeJSON(w, e.Status, e)
		return
	}
	if res.replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.Header().Set("Location", "/notifications/"+res.ID)
	writeJSON(w, http.StatusCreated, res.Created)
}

type createResult struct {
	Created
	replayed bool
}

var traceparentRE = regexp.MustCompile(`^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)

// create writes the notification row and its outbox event in one
// transaction. With an idempotency key, a repeat of an earlier request
// returns the first result and writes nothing; the unique constraint on
// idempotency_key makes racing repeats write once.
func (a *App) create(ctx context.Context, req *Request, key, traceparent string) (*createResult, *APIError) {
	var keyArg, hashArg any
	var hash []byte
	if key != "" {
		hash = req.hash()
		keyArg, hashArg = key, hash
	}
	tx, err := a.pool.Begin(ctx)
	if err != nil {
		a.log.Error("app: begin transaction", "error", err)
		return nil, apiErr(http.StatusServiceUnavailable, "", CodeUnavailable, "the database is unavailable; nothing was written, retry later")
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit it is a no-op

	var id int64
	err = tx.QueryRow(ctx, `
		INSERT INTO notifications (user_id, channel, to_addr, subject, body, idempotency_key, request_hash)
		VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (idempotency_key) DO NOTHING
		RETURNING id`,
		req.UserID, req.Channel, req.To, req.Subject, req.Body, keyArg, hashArg).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		// The key is taken by a committed row (ON CONFLICT waited for a
		// concurrent inserter to finish); this statement's fresh snapshot
		// sees it.
		var stored []byte
		var status string
		err = tx.QueryRow(ctx, `SELECT id, request_hash, status FROM notifications WHERE idempotency_key = $1`, key).Scan(&id, &stored, &status)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, apiErr(http.StatusConflict, "Idempotency-Key", CodeIdempotencyConflict,
				"the request with this Idempotency-Key changed concurrently; retry")
		}
		if err != nil {
			return nil, a.internal("look up idempotency key", err)
		}
		if !bytes.Equal(stored, hash) {
			return nil, apiErr(http.StatusUnprocessableEntity, "Idempotency-Key", CodeIdempotencyKeyReused,
				"this Idempotency-Key was used with a different request")
		}
		// The current status, not the first answer's "pending": a client
		// repeating the request after the mail went out learns it is sent.
		return &createResult{Created: Created{ID: strconv.FormatInt(id, 10), Status: status}, replayed: true}, nil
	}
	if err != nil {
		return nil, a.dbErr("insert notification", err)
	}
	idS := strconv.FormatInt(id, 10)
	opts := []ferry.EnqueueOption{ferry.WithKey(req.UserID), ferry.WithAppID(idS), ferry.WithDestination(a.cfg.Destination)}
	if traceparentRE.MatchString(traceparent) {
		opts = append(opts, ferry.WithHeader(broker.HeaderTraceparent, traceparent))
	}
	if _, err := ferry.Enqueue(ctx, tx, EventNotificationRequested,
		RequestedEvent{NotificationID: idS, UserID: req.UserID, Channel: req.Channel}, opts...); err != nil {
		return nil, a.dbErr("enqueue outbox event", err)
	}
	if a.cfg.DebugFailAfterOutbox {
		return nil, apiErr(http.StatusInternalServerError, "", CodeDebugFailure,
			"failing after the outbox insert as --debug-fail-after-outbox asks; the transaction is rolled back")
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, a.dbErr("commit", err)
	}
	return &createResult{Created: Created{ID: idS, Status: StatusPending}}, nil
}

// dbErr maps a database error to an answer: PostgreSQL's data exceptions
// (class 22, e.g. a character it cannot store) are the client's input
// (422); anything else is a 500.
func (a *App) dbErr(what string, err error) *APIError {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && len(pe.Code) == 5 && pe.Code[:2] == "22" {
		return apiErr(http.StatusUnprocessableEntity, "", CodeInvalidCharacters, "the database refused the value: %s", pe.Message)
	}
	return a.internal(what, err)
}

func (a *App) internal(what string, err error) *APIError {
	a.log.Error("app: "+what, "error", err)
	return apiErr(http.StatusInternalServerError, "", CodeInternal, "internal error (%s); nothing was written", what)
}

func (a *App) handleGet(w http.ResponseWriter, r *http.Request) {
	n, err := a.Status(r.Context(), r.PathValue("id"))
	if errors.Is(err, ErrNotFound) {
		writeJSON(w, http.StatusNotFound, &APIError{Code: CodeNotFound, Field: "id", Message: "no notification with id " + strconv.Quote(clip(r.PathValue("id")))})
		return
	}
	if err != nil {
		// Status's only other errors are the database's (down, timed
		// out): the client may retry, as for POST. The driver's error
		// names hosts and users; it goes to the log only.
		a.log.Error("app: GET /notifications/{id} failed", "error", err)
		writeJSON(w, http.StatusServiceUnavailable, apiErr(http.StatusServiceUnavailable, "", CodeUnavailable,
			"the database is unavailable; the notification could not be read, retry later"))
		return
	}
	writeJSON(w, http.StatusOK, n)
}

// handleReady answers GET /readyz. The reason given is generic (the
// database error itself, which names users, hosts and databases, goes to
// the log, once per change of reason).
func (a *App) handleReady(w http.ResponseWriter, r *http.Request) {
	reason, err := a.ready(r.Context())
	if err != nil {
		if prev, _ := a.lastUnready.Swap(reason).(string); prev != reason {
			a.log.Warn("app: not ready", "reason", reason, "error", err)
		}
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "error": reason})
		return
	}
	if prev, _ := a.lastUnready.Swap("").(string); prev != "" {
		a.log.Info("app: ready again")
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// checkMediaType refuses a body the API would misread: a Content-Type
// other than application/json (parameters are allowed; a charset must be
// UTF-8, the only encoding of JSON text), or a Content-Encoding other than
// identity. A missing Content-Type is read as JSON.
func checkMediaType(h http.Header) *APIError {
	for _, enc := range h.Values("Content-Encoding") {
		for _, e := range strings.Split(enc, ",") {
			if e = strings.TrimSpace(e); e != "" && !strings.EqualFold(e, "identity") {
				return apiErr(http.StatusUnsupportedMediaType, "Content-Encoding", CodeUnsupportedMediaType,
					"Content-Encoding %q is not supported; send the JSON uncompressed", clip(e))
			}
		}
	}
	ct := h.Values("Content-Type")
	if len(ct) == 0 {
		return nil
	}
	if len(ct) > 1 {
		return apiErr(http.StatusUnsupportedMediaType, "Content-Type", CodeUnsupportedMediaType, "Content-Type given %d times; give it once", len(ct))
	}
	mt, params, err := mime.ParseMediaType(ct[0])
	if err != nil || mt != "application/json" {
		hint := ""
		if mt == "application/x-www-form-urlencoded" {
			hint = " (curl -d sends that type unless -H 'Content-Type: application/json' is given)"
		}
		return apiErr(http.StatusUnsupportedMediaType, "Content-Type", CodeUnsupportedMediaType,
			"Content-Type %q is not supported; send application/json%s", clip(ct[0]), hint)
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") && !strings.EqualFold(cs, "utf8") {
		return apiErr(http.StatusUnsupportedMediaType, "Content-Type", CodeUnsupportedMediaType,
			"charset %q is not supported; JSON is UTF-8", clip(cs))
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":"internal error: encoding the answer","code":"internal"}`)
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(append(b, '\n')) //nolint:errcheck // the client is gone
}
