package app_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/app"
)

func TestParseRequestAccepts(t *testing.T) {
	t.Parallel()
	for name, body := range map[string]string{
		"all fields":         `{"user_id":"u-1","channel":"email","to":"anna.1@example.com","subject":"Hi","body":"Hello"}`,
		"no subject":         `{"user_id":"u-1","channel":"email","to":"a@example.com","body":"Hello"}`,
		"null subject":       `{"user_id":"u-1","channel":"email","to":"a@example.com","subject":null,"body":"Hello"}`,
		"CRLF tabs escaped":  `{"user_id":"u-1","channel":"email","to":"a@example.com","body":"line\r\n\tindented"}`,
		"emoji and Russian":  `{"user_id":"u-1","channel":"email","to":"a@example.com","subject":"Счёт 🎉","body":"Привет 👋"}`,
		"escaped surrogates": `{"user_id":"u-1","channel":"email","to":"a@example.com","body":"\ud83d\ude00"}`,
		"tab in subject":     `{"user_id":"u-1","channel":"email","to":"a@example.com","subject":"a\tb","body":"x"}`,
		"subdomain address":  `{"user_id":"u-1","channel":"email","to":"nikolai.389@mail.example.com","body":"x"}`,
		"plus address":       `{"user_id":"u-1","channel":"email","to":"a+tag@example.com","body":"x"}`,
		"whitespace around":  " \n{\"user_id\":\"u-1\",\"channel\":\"email\",\"to\":\"a@example.com\",\"body\":\"x\"}\n ",
	} {
		req, e := app.ParseRequest([]byte(body), 0)
		require.Nil(t, e, "%s: %v", name, e)
		require.Equal(t, "email", req.Channel, name)
	}
	req, e := app.ParseRequest([]byte(`{"user_id":"u","channel":"email","to":"a@example.com","body":"`+strings.Repeat("ж", 32768)+`"}`), 0)
	require.Nil(t, e)
	require.Len(t, req.Body, 65536)
	_, e = app.ParseRequest([]byte(`{"user_id":"u","channel":"email","to":"a@example.com","body":"`+strings.Repeat("ж", 32768)+`!"}`), 0)
	require.NotNil(t, e)
	require.Equal(t, http.StatusRequestEntityTooLarge, e.Status)
	require.Equal(t, "body", e.Field)
	_, e = app.ParseRequest([]byte(`{"user_id":"u","channel":"email","to":"a@example.com","body":"123456"}`), 5)
	require.NotNil(t, e, "a smaller MaxBodyBytes is honoured")
	require.Equal(t, app.CodeBodyTooLarge, e.Code)
}

func TestAPIErrorShape(t *testing.T) {
	t.Parallel()
	_, e := app.ParseRequest([]byte(`{"user_id":"u","channel":"email","to":"not-an-address","body":"x"}`), 0)
	require.NotNil(t, e)
	require.Equal(t, http.StatusUnprocessableEntity, e.Status)
	require.Equal(t, "to", e.Field)
	require.Equal(t, app.CodeInvalidAddress, e.Code)
	require.Contains(t, e.Message, "not-an-address")
	require.Contains(t, e.Error(), "app: to:")
}
