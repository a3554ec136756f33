package alert

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// DefaultTelegramBaseURL is the Telegram Bot API base URL NewTelegram uses
// when baseURL is empty.
const DefaultTelegramBaseURL = "https://api.telegram.org"

// maxErrorBody bounds how much of a refusing receiver's body goes into an
// error (bytes).
const maxErrorBody = 512

// Webhook posts each Notification as a JSON object (the Notification's json
// fields plus "text", the one-message rendering of TelegramText, which makes
// Slack- and Mattermost-style incoming webhooks show it) to a URL, with
// Content-Type application/json. Any 2xx answer is
// success; anything else is an error wrapping ErrNotify.
type Webhook struct {
	url    string
	name   string
	client *http.Client
}

type webhookBody struct {
	Notification
	Text string `json:"text"`
}

// NewWebhook returns a Webhook posting to rawURL, which must be an absolute
// http or https URL. The error wraps ErrConfig.
func NewWebhook(rawURL string) (*Webhook, error) {
	u, err := parseHTTPURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("%w: webhook URL: %v", ErrConfig, err)
	}
	return &Webhook{url: rawURL, name: "webhook " + u.Scheme + "://" + u.Host, client: http.DefaultClient}, nil
}

// String returns "webhook scheme://host" (no path or query, which may hold
// secrets).
func (w *Webhook) String() string { return w.name }

// Notify posts n. Errors never contain the URL's path or query.
func (w *Webhook) Notify(ctx context.Context, n Notification) error {
	body, err := json.Marshal(webhookBody{Notification: n, Text: TelegramText(n)})
	if err != nil {
		return fmt.Errorf("alert: %s: encode: %w", w.name, err)
	}
	_, err = post(ctx, w.client, w.url, w.name, body)
	return err
}

// Telegram sends each Notification as a plain-text message through the
// Telegram Bot API method sendMessage
// (https://core.telegram.org/bots/api#sendmessage): POST
// {baseURL}/bot{token}/sendMessage with the JSON body
// {"chat_id": chatID, "text": ..., "disable_web_page_preview": true}.
// The answer must be 2xx with "ok": true; otherwise the error wraps
// ErrNotify and carries Telegram's description. Errors never contain the
// token.
type Telegram struct {
	endpoint string
	chatID   string
	name     string
	client   *http.Client
}

// NewTelegram returns a Telegram notifier. token is the bot token (from
// @BotFather) and chatID the target chat: a numeric id or "@channelname";
// both are required. baseURL defaults to DefaultTelegramBaseURL; tests point
// it at a local server. The error wraps ErrConfig.
func NewTelegram(token, chatID, baseURL string) (*Telegram, error) {
	if token == "" {
		return nil, fmt.Errorf("%w: telegram: token is required", ErrConfig)
	}
	if strings.ContainsAny(token, "/?# \t\r\n") {
		return nil, fmt.Errorf("%w: telegram: token contains characters not allowed in a bot token", ErrConfig)
	}
	if chatID == "" {
		return nil, fmt.Errorf("%w: telegram: chat ID is required", ErrConfig)
	}
	if baseURL == "" {
		baseURL = DefaultTelegramBaseURL
	}
	u, err := parseHTTPURL(baseURL)
	if err != nil {
		return nil, fmt.Errorf("%w: telegram: base URL: %v", ErrConfig, err)
	}
	endpoint := strings.TrimRight(baseURL, "/") + "/bot" + token + "/sendMessage"
	return &Telegram{
		endpoint: endpoint,
		chatID:   chatID,
		name:     "telegram " + u.Scheme + "://" + u.Host + " chat " + chatID,
		client:   http.DefaultClient,
	}, nil
}

// String returns "telegram scheme://host chat ID" (never the token).
func (t *Telegram) String() string { return t.name }

// TelegramText renders n as the plain text Telegram sends.
func TelegramText(n Notification) string {
	var b strings.Builder
	if n.Status == StatusFiring {
		b.WriteString("FIRING ")
	} else {
		b.WriteString("RESOLVED ")
	}
	b.WriteString(n.Alert)
	b.WriteString(": ")
	b.WriteString(n.Summary)
	for _, k := range slices.Sorted(maps.Keys(n.Labels)) {
		fmt.Fprintf(&b, "\n%s=%s", k, n.Labels[k])
	}
	return b.String()
}

// Notify sends n to the chat.
func (t *Telegram) Notify(ctx context.Context, n Notification) error {
	body, err := json.Marshal(map[string]any{
		"chat_id":                  t.chatID,
		"text":                     TelegramText(n),
		"disable_web_page_preview": true,
	})
	if err != nil {
		return fmt.Errorf("alert: %s: encode: %w", t.name, err)
	}
	resp, err := post(ctx, t.client, t.endpoint, t.name, body)
	if err != nil {
		return err
	}
	var answer struct {
		OK          bool   `json:"ok"`
		Description string `json:"description"`
	}
	if err := json.Unmarshal(resp, &answer); err != nil {
		return fmt.Errorf("%w: %s: answer is not Bot API JSON: %v", ErrNotify, t.name, err)
	}
	if !answer.OK {
		return fmt.Errorf("%w: %s: ok=false: %s", ErrNotify, t.name, answer.Description)
	}
	return nil
}

// post sends body as JSON to target and returns the answer's body for a 2xx
// status. Errors name the target as name, never as target (which may hold
// secrets).
func post(ctx context.Context, client *http.Client, target, name string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("alert: %s: build request: %w", name, redact(err))
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("alert: %s: %w", name, ctx.Err())
		}
		return nil, fmt.Errorf("alert: %s: %w", name, redact(err))
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("alert: %s: read answer: %w", name, redact(err))
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		snippet := data
		if len(snippet) > maxErrorBody {
			snippet = snippet[:maxErrorBody]
		}
		return nil, fmt.Errorf("%w: %s: HTTP %d: %s", ErrNotify, name, resp.StatusCode, strings.TrimSpace(string(snippet)))
	}
	return data, nil
}

// redact strips the URL from a *url.Error, keeping its operation and cause.
func redact(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("%s: %w", ue.Op, ue.Err)
	}
	return err
}

func parseHTTPURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, redact(err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("scheme %q: want http or https", u.Scheme)
	}
	if u.Host == "" {
		return nil, errors.New("missing host")
	}
	return u, nil
}
