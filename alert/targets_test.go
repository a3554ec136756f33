package alert_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/alert"
)

func TestTargets(t *testing.T) {
	t.Parallel()
	ns, err := alert.Targets{}.Notifiers()
	require.NoError(t, err)
	require.Empty(t, ns)

	ns, err = alert.Targets{
		WebhookURLs:   []string{"http://127.0.0.1:9/a", " ", "https://hooks.example/b?k=secret"},
		TelegramToken: "1:tok", TelegramChatID: "-100", TelegramBaseURL: "http://127.0.0.1:9",
	}.Notifiers()
	require.NoError(t, err)
	require.Len(t, ns, 3)
	require.Equal(t, "webhook http://127.0.0.1:9", ns[0].String())
	require.Equal(t, "webhook https://hooks.example", ns[1].String())
	require.Equal(t, "telegram http://127.0.0.1:9 chat -100", ns[2].String())

	_, err = alert.Targets{TelegramToken: "1:tok"}.Notifiers()
	require.ErrorIs(t, err, alert.ErrConfig)
	require.NotContains(t, err.Error(), "1:tok")
	_, err = alert.Targets{TelegramChatID: "5"}.Notifiers()
	require.ErrorIs(t, err, alert.ErrConfig)
	_, err = alert.Targets{WebhookURLs: []string{"nope"}}.Notifiers()
	require.ErrorIs(t, err, alert.ErrConfig)
}
