package rabbitmq

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
)

func TestRetryLevel(t *testing.T) {
	ms := time.Millisecond
	delays := []time.Duration{200 * ms, 1000 * ms, 400 * ms}
	for _, tc := range []struct {
		want time.Duration
		lvl  int
	}{
		{0, 0}, {200 * ms, 0}, {201 * ms, 2}, {400 * ms, 2}, {401 * ms, 1}, {time.Hour, 1},
	} {
		require.Equal(t, tc.lvl, retryLevel(delays, tc.want), "delay %v", tc.want)
	}
	require.Equal(t, 0, retryLevel([]time.Duration{time.Second}, time.Hour))
}

func TestTTLMillis(t *testing.T) {
	require.Equal(t, int64(1), ttlMillis(time.Microsecond))
	require.Equal(t, int64(200), ttlMillis(200*time.Millisecond))
	require.Equal(t, int64(201), ttlMillis(200*time.Millisecond+time.Microsecond))
}

func TestRedact(t *testing.T) {
	require.Equal(t, "amqp://guest:xxxxx@127.0.0.1:5672/", redact("amqp://guest:secret@127.0.0.1:5672/"))
	require.Equal(t, "amqp://127.0.0.1:5672/", redact("amqp://127.0.0.1:5672/"))
}

func TestFromAMQP(t *testing.T) {
	m := fromAMQP("7", "", "fallback.key", map[string]any{
		keyHeader: "user-1", "a": "b", "n": int32(5), "x-death": []any{},
		"x-first-death-queue": "q", broker.HeaderRetryCount: "3",
	}, nil)
	require.Equal(t, "7", m.ID)
	require.Equal(t, "fallback.key", m.Type)
	require.Equal(t, "user-1", m.Key)
	require.Equal(t, []byte{}, m.Body)
	require.Equal(t, map[string]string{"a": "b", broker.HeaderRetryCount: "3"}, m.Headers)
	require.Equal(t, 4, m.Attempt)
	require.Equal(t, 1, fromAMQP("1", "t", "", map[string]any{broker.HeaderRetryCount: "junk"}, nil).Attempt)
}

func TestCheckMessage(t *testing.T) {
	r := &rabbit{cfg: Config{}.withDefaults()}
	require.NoError(t, r.check(&broker.Message{ID: "1", Type: "a.b"}))
	require.ErrorIs(t, r.check(&broker.Message{ID: "1", Type: "a.b", Body: make([]byte, DefaultMaxMessageBytes)}), broker.ErrMessageTooLarge)
	many := map[string]string{}
	for i := 0; i < 30000; i++ {
		many[string(rune('a'+i%26))+string(rune(0x4e00+i))] = ""
	}
	require.ErrorIs(t, r.check(&broker.Message{ID: "1", Type: "a.b", Headers: many}), broker.ErrMessageTooLarge, "many small headers overflow one frame")
}
