package alert

import (
	"fmt"
	"strings"
)

// Targets are the notification targets as the command line gives them
// (ferry relay|run --alert-webhook-url, --alert-telegram-token,
// --alert-telegram-chat-id, --alert-telegram-api-url).
type Targets struct {
	// WebhookURLs each get a Webhook. Empty strings are ignored.
	WebhookURLs []string
	// TelegramToken and TelegramChatID enable the Telegram notifier; give
	// both or neither.
	TelegramToken  string
	TelegramChatID string
	// TelegramBaseURL defaults to DefaultTelegramBaseURL.
	TelegramBaseURL string
}

// Notifiers builds the notifiers of t, in the order webhooks, Telegram.
// No target is not an error (the alert then only logs). Errors wrap
// ErrConfig and never contain the Telegram token.
func (t Targets) Notifiers() ([]Notifier, error) {
	var out []Notifier
	for i, u := range t.WebhookURLs {
		if strings.TrimSpace(u) == "" {
			continue
		}
		w, err := NewWebhook(strings.TrimSpace(u))
		if err != nil {
			return nil, fmt.Errorf("webhook %d: %w", i+1, err)
		}
		out = append(out, w)
	}
	switch {
	case t.TelegramToken == "" && t.TelegramChatID == "":
	case t.TelegramToken == "":
		return nil, fmt.Errorf("%w: telegram: a chat ID was given without a bot token", ErrConfig)
	case t.TelegramChatID == "":
		return nil, fmt.Errorf("%w: telegram: a bot token was given without a chat ID", ErrConfig)
	default:
		tg, err := NewTelegram(t.TelegramToken, t.TelegramChatID, t.TelegramBaseURL)
		if err != nil {
			return nil, err
		}
		out = append(out, tg)
	}
	return out, nil
}
