package app

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/mail"
	"strings"
	"unicode/utf8"
)

// Error codes of the API's 4xx answers (the "code" member of the JSON error
// body). They are stable, so clients and the demo can group rejections by
// them.
const (
	// CodeMalformedJSON (400): the request body is not one JSON object.
	CodeMalformedJSON = "malformed_json"
	// CodeInvalidUTF8: a field is not valid text, which PostgreSQL refuses
	// to store. 400 when the field's raw bytes are not UTF-8 (the request
	// is not JSON text at all); 422 when it is valid JSON whose string
	// holds an unpaired UTF-16 surrogate escape such as "\ud800", which
	// encodes no character (decoders silently turn it into U+FFFD).
	CodeInvalidUTF8 = "invalid_utf8"
	// CodeDuplicateField (400): the object has the same member twice
	// (after unescaping), e.g. two "to"; the API refuses to guess which
	// one was meant.
	CodeDuplicateField = "duplicate_field"
	// CodeUnknownField (422): the object has a member the API does not know.
	CodeUnknownField = "unknown_field"
	// CodeMissingField (422): a required field is absent or null.
	CodeMissingField = "missing_field"
	// CodeInvalidType (422): a field is not a JSON string.
	CodeInvalidType = "invalid_type"
	// CodeEmptyField (422): a required field is empty or only white space.
	CodeEmptyField = "empty_field"
	// CodeTooLong (422): a short field (user_id, to, subject) exceeds its limit.
	CodeTooLong = "too_long"
	// CodeInvalidCharacters (422): a field holds U+0000 (PostgreSQL refuses
	// it) or a control character not allowed there (line breaks in subject).
	CodeInvalidCharacters = "invalid_characters"
	// CodeInvalidAddress (422): "to" is not a bare RFC 5322 address.
	CodeInvalidAddress = "invalid_address"
	// CodeUnsupportedChannel (422): "channel" is not a channel the service
	// delivers (only "email" is built).
	CodeUnsupportedChannel = "unsupported_channel"
	// CodeBodyTooLarge (413): the "body" field exceeds Config.MaxBodyBytes.
	CodeBodyTooLarge = "body_too_large"
	// CodeRequestTooLarge (413): the whole HTTP request body exceeds the
	// request limit (see Config.MaxBodyBytes), so no field was read; the
	// answer names no field.
	CodeRequestTooLarge = "request_too_large"
	// CodeInvalidIdempotencyKey (400): the Idempotency-Key header is empty,
	// longer than MaxIdempotencyKeyBytes, repeated, or not visible ASCII.
	CodeInvalidIdempotencyKey = "invalid_idempotency_key"
	// CodeIdempotencyKeyReused (422): the Idempotency-Key was first used with
	// a different request.
	CodeIdempotencyKeyReused = "idempotency_key_reused"
	// CodeIdempotencyConflict (409): the row holding the Idempotency-Key
	// vanished while the request looked it up; retrying is safe.
	CodeIdempotencyConflict = "idempotency_conflict"
	// CodeNotFound (404): no notification has that id (ids are canonical
	// positive decimal integers: "1", never "01" or "+1"), or no such
	// endpoint.
	CodeNotFound = "not_found"
	// CodeMethodNotAllowed (405): the path exists but not with this
	// method; the Allow header lists the methods it has.
	CodeMethodNotAllowed = "method_not_allowed"
	// CodeUnsupportedMediaType (415): Content-Type is present and not
	// application/json (parameters allowed, charset only UTF-8), or
	// Content-Encoding is present and not identity. A request without
	// Content-Type is read as JSON.
	CodeUnsupportedMediaType = "unsupported_media_type"
	// CodeRequestTimeout (408): the request body did not arrive in time
	// (the HTTP server's read timeout).
	CodeRequestTimeout = "request_timeout"
	// CodeInternal (500): a server-side failure; the request wrote nothing.
	CodeInternal = "internal"
	// CodeUnavailable (503): the database could not be reached; nothing was
	// written and the request may be retried.
	CodeUnavailable = "unavailable"
	// CodeDebugFailure (500): --debug-fail-after-outbox made the request fail.
	CodeDebugFailure = "debug_fail_after_outbox"
)

// Limits of the short fields, in bytes of UTF-8.
const (
	// MaxUserIDBytes bounds "user_id".
	MaxUserIDBytes = 255
	// MaxAddressBytes bounds "to" (RFC 5321 section 4.5.3.1.3 path limit).
	MaxAddressBytes = 254
	// MaxSubjectBytes bounds "subject" (RFC 5322 line length before folding).
	MaxSubjectBytes = 998
	// MaxIdempotencyKeyBytes bounds the Idempotency-Key header.
	MaxIdempotencyKeyBytes = 255
	// MaxEventBytes bounds the size (broker.Message.Size) of the
	// notification.requested event the service enqueues: the ids and the
	// channel in JSON (at most 6 bytes per byte of user_id when escaped)
	// plus the traceparent and ferry's headers. The mail itself stays in
	// the notifications row. The CLI checks it against the broker's
	// Capabilities.MaxMessageBytes at start.
	MaxEventBytes = 4096
)

// ChannelEmail is the only channel built so far.
const ChannelEmail = "email"

// APIError is the JSON body of every error answer:
// {"error": "...", "field": "to", "code": "invalid_address"}. Field is the
// request field (or header) at fault, empty when the problem is not one
// field's.
type APIError struct {
	// Status is the HTTP status code; not serialized.
	Status int `json:"-"`
	// Message says what is wrong, for people.
	Message string `json:"error"`
	// Field names the JSON field or header at fault, or is empty.
	Field string `json:"field,omitempty"`
	// Code is one of the Code constants, for machines.
	Code string `json:"code"`
}

// Error implements error.
func (e *APIError) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("app: %s: %s (%s)", e.Field, e.Message, e.Code)
	}
	return fmt.Sprintf("app: %s (%s)", e.Message, e.Code)
}

func apiErr(status int, field, code, format string, args ...any) *APIError {
	return &APIError{Status: status, Field: field, Code: code, Message: fmt.Sprintf(format, args...)}
}

// Request is a validated POST /notifications body.
type Request struct {
	// UserID is the recipient's user id in the calling system.
	UserID string `json:"user_id"`
	// Channel is the delivery channel; always ChannelEmail for now.
	Channel string `json:"channel"`
	// To is the recipient's bare email address.
	To string `json:"to"`
	// Subject is the mail subject; may be empty.
	Subject string `json:"subject"`
	// Body is the plain-text mail body, 1..MaxBodyBytes bytes.
	Body string `json:"body"`
}

// hash returns the SHA-256 of the normalized request, stored with an
// Idempotency-Key to tell a true repeat from a reused key.
func (r *Request) hash() []byte {
	b, _ := json.Marshal(r) // a struct of strings always marshals
	sum := sha256.Sum256(b)
	return sum[:]
}

var knownFields = map[string]bool{"user_id": true, "channel": true, "to": true, "subject": true, "body": true}

// fieldOrder is the order in which fields are checked, so the first
// problem reported is deterministic.
var fieldOrder = []string{"user_id", "channel", "to", "subject", "body"}

// ParseRequest decodes and validates a POST /notifications body. It
// returns the first problem found as an *APIError naming the field and a
// Code constant: malformed JSON, a duplicate member, invalid UTF-8 (or an
// unpaired surrogate escape), unknown, missing, mistyped or empty fields, over-long fields, U+0000, a bad address, an unknown
// channel, or a body over maxBody bytes (413). maxBody <= 0 means
// DefaultMaxBodyBytes.
func ParseRequest(data []byte, maxBody int) (*Request, *APIError) {
	if maxBody <= 0 {
		maxBody = DefaultMaxBodyBytes
	}
	raw, e := decodeObject(data)
	if e != nil {
		return nil, e
	}
	for name := range raw {
		if !knownFields[name] {
			return nil, apiErr(http.StatusUnprocessableEntity, name, CodeUnknownField,
				"unknown field %q; the fields are user_id, channel, to, subject, body", clip(name))
		}
	}
	var req Request
	dst := map[string]*string{"user_id": &req.UserID, "channel": &req.Channel, "to": &req.To, "subject": &req.Subject, "body": &req.Body}
	for _, name := range fieldOrder {
		v, present, e := stringField(raw, name)
		if e != nil {
			return nil, e
		}
		if !present && name != "subject" {
			return nil, apiErr(http.StatusUnprocessableEntity, name, CodeMissingField, "%s is required", name)
		}
		*dst[name] = v
	}
	if e := checkText("user_id", req.UserID, MaxUserIDBytes, false); e != nil {
		return nil, e
	}
	if req.Channel != ChannelEmail {
		return nil, apiErr(http.StatusUnprocessableEntity, "channel", CodeUnsupportedChannel,
			"channel %q is not supported; supported: %q", clip(req.Channel), ChannelEmail)
	}
	if e := checkAddress(req.To); e != nil {
		return nil, e
	}
	if len(req.Subject) > MaxSubjectBytes {
		return nil, apiErr(http.StatusUnprocessableEntity, "subject", CodeTooLong, "subject is %d bytes, at most %d allowed", len(req.Subject), MaxSubjectBytes)
	}
	if i := strings.IndexFunc(req.Subject, func(r rune) bool { return r < 0x20 && r != '\t' || r == 0x7f }); i >= 0 {
		return nil, apiErr(http.StatusUnprocessableEntity, "subject", CodeInvalidCharacters,
			"subject contains control character U+%04X at byte %d; line breaks and U+0000 are not allowed", req.Subject[i], i)
	}
	if len(req.Body) > maxBody {
		return nil, apiErr(http.StatusRequestEntityTooLarge, "body", CodeBodyTooLarge, "body is %d bytes, at most %d allowed", len(req.Body), maxBody)
	}
	if strings.TrimSpace(req.Body) == "" {
		return nil, apiErr(http.StatusUnprocessableEntity, "body", CodeEmptyField, "body must not be empty")
	}
	if i := strings.IndexByte(req.Body, 0); i >= 0 {
		return nil, apiErr(http.StatusUnprocessableEntity, "body", CodeInvalidCharacters, "body contains U+0000 at byte %d, which cannot be stored", i)
	}
	return &req, nil
}

// decodeObject decodes one JSON object into its members, undecoded, in a
// single pass. It refuses a member given twice (after unescaping its name:
// "to" and "t\u006f" are the same member), which a plain decode into a
// map would silently resolve in favour of the last.
func decodeObject(data []byte) (map[string]json.RawMessage, *APIError) {
	malformed := func(format string, args ...any) *APIError {
		return apiErr(http.StatusBadRequest, "", CodeMalformedJSON, format, args...)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err == io.EOF {
		return nil, malformed("request body is empty; want a JSON object")
	}
	if err != nil {
		return nil, malformed("request body is not valid JSON: %v", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, malformed("request body must be a JSON object, got %s", tokenKind(tok))
	}
	raw := make(map[string]json.RawMessage, len(fieldOrder))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, malformed("request body is not valid JSON: %v", err)
		}
		name, _ := tok.(string) // inside an object, Token returns the member name
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, malformed("request body is not valid JSON: %v", err)
		}
		if _, dup := raw[name]; dup {
			return nil, apiErr(http.StatusBadRequest, clip(name), CodeDuplicateField,
				"field %q is given more than once; give each field once", clip(name))
		}
		raw[name] = v
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, malformed("request body is not valid JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, malformed("request body has data after the JSON object")
	}
	return raw, nil
}

func tokenKind(tok json.Token) string {
	switch v := tok.(type) {
	case nil:
		return "null"
	case json.Delim:
		if v == '[' {
			return "an array"
		}
		return string(v)
	case string:
		return "a string"
	case bool:
		return "a boolean"
	default:
		return "a number"
	}
}

// stringField returns raw[name] decoded as a JSON string; present is false
// when the member is absent or null.
func stringField(raw map[string]json.RawMessage, name string) (string, bool, *APIError) {
	v, ok := raw[name]
	if !ok {
		return "", false, nil
	}
	v = bytes.TrimSpace(v)
	if string(v) == "null" {
		return "", false, nil
	}
	if !utf8.Valid(v) {
		return "", false, apiErr(http.StatusBadRequest, name, CodeInvalidUTF8, "%s is not valid UTF-8", name)
	}
	if len(v) == 0 || v[0] != '"' {
		return "", false, apiErr(http.StatusUnprocessableEntity, name, CodeInvalidType, "%s must be a string, got %s", name, jsonKind(v))
	}
	if i := unpairedSurrogate(v); i >= 0 {
		return "", false, apiErr(http.StatusUnprocessableEntity, name, CodeInvalidUTF8,
			"%s holds the escape %s at byte %d, half of a UTF-16 surrogate pair, which is no character", name, v[i:i+6], i-1)
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", false, apiErr(http.StatusBadRequest, name, CodeMalformedJSON, "%s: %v", name, err)
	}
	return s, true, nil
}

// unpairedSurrogate returns the offset in the JSON string literal v of a
// \uXXXX escape that encodes half of a UTF-16 surrogate pair without its
// other half, or -1. encoding/json decodes such an escape to U+FFFD
// without an error.
func unpairedSurrogate(v []byte) int {
	for i := 0; i < len(v); i++ {
		j := bytes.IndexByte(v[i:], '\\')
		if j < 0 {
			return -1
		}
		i += j + 1 // the escaped character
		if i >= len(v) || v[i] != 'u' {
			continue
		}
		r, ok := hex4(v[i+1:])
		if !ok {
			continue // malformed; json.Unmarshal reports it
		}
		switch {
		case r >= 0xD800 && r < 0xDC00: // high half: a low half must follow
			if len(v) >= i+11 && v[i+5] == '\\' && v[i+6] == 'u' {
				if lo, ok := hex4(v[i+7:]); ok && lo >= 0xDC00 && lo < 0xE000 {
					i += 10
					continue
				}
			}
			return i - 1
		case r >= 0xDC00 && r < 0xE000: // a low half alone
			return i - 1
		}
		i += 4
	}
	return -1
}

// hex4 decodes the four hex digits at the start of b.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// checkText rejects an empty (or blank), over-long or control-character
// value of a short field.
func checkText(field, v string, max int, allowEmpty bool) *APIError {
	if !allowEmpty && strings.TrimSpace(v) == "" {
		return apiErr(http.StatusUnprocessableEntity, field, CodeEmptyField, "%s must not be empty", field)
	}
	if len(v) > max {
		return apiErr(http.StatusUnprocessableEntity, field, CodeTooLong, "%s is %d bytes, at most %d allowed", field, len(v), max)
	}
	if i := strings.IndexFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }); i >= 0 {
		return apiErr(http.StatusUnprocessableEntity, field, CodeInvalidCharacters, "%s contains control character U+%04X at byte %d", field, v[i], i)
	}
	return nil
}

// checkAddress accepts a bare RFC 5322 addr-spec (no display name, no
// angle brackets, no surrounding space) with a non-empty local part and
// domain.
func checkAddress(to string) *APIError {
	if e := checkText("to", to, MaxAddressBytes, false); e != nil {
		return e
	}
	a, err := mail.ParseAddress(to)
	if err != nil || a.Name != "" || a.Address != to {
		reason := "want a bare address such as user@example.com"
		if err != nil {
			reason = err.Error()
		}
		return apiErr(http.StatusUnprocessableEntity, "to", CodeInvalidAddress, "%q is not an email address: %s", clip(to), reason)
	}
	at := strings.LastIndexByte(to, '@')
	if at <= 0 || at == len(to)-1 {
		return apiErr(http.StatusUnprocessableEntity, "to", CodeInvalidAddress, "%q is not an email address: want local@domain", clip(to))
	}
	return nil
}

// checkIdempotencyKey validates an Idempotency-Key header value.
func checkIdempotencyKey(vals []string) (string, *APIError) {
	if len(vals) == 0 {
		return "", nil
	}
	const field = "Idempotency-Key"
	if len(vals) > 1 {
		return "", apiErr(http.StatusBadRequest, field, CodeInvalidIdempotencyKey, "Idempotency-Key given %d times; give it once", len(vals))
	}
	k := vals[0]
	if strings.TrimSpace(k) == "" || len(k) > MaxIdempotencyKeyBytes {
		return "", apiErr(http.StatusBadRequest, field, CodeInvalidIdempotencyKey, "Idempotency-Key must be 1..%d bytes, got %d", MaxIdempotencyKeyBytes, len(k))
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return "", apiErr(http.StatusBadRequest, field, CodeInvalidIdempotencyKey, "Idempotency-Key must be visible ASCII; byte %d is 0x%02x", i, k[i])
		}
	}
	return k, nil
}

func jsonKind(v []byte) string {
	switch {
	case len(v) == 0:
		return "nothing"
	case v[0] == '{':
		return "an object"
	case v[0] == '[':
		return "an array"
	case v[0] == 't' || v[0] == 'f':
		return "a boolean"
	default:
		return "a number"
	}
}

// clip shortens a value echoed in an error message to 64 bytes, at a UTF-8
// boundary, and makes it valid UTF-8.
func clip(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= 64 {
		return s
	}
	cut := 64
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
