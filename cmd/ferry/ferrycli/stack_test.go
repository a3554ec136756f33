package ferrycli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/internal/testenv"
)

// The API server times out a stalled request body (slowloris): the client
// gets 408 and the connection is closed, instead of holding a connection
// and a goroutine for as long as it likes. The read timeout is shortened
// for the test; the production values are checked below.
func TestAPIServerTimesOutStalledBody(t *testing.T) {
	require.Equal(t, 10*time.Second, apiServerTimeouts.readHeader)
	require.Equal(t, 30*time.Second, apiServerTimeouts.read)
	require.Equal(t, 120*time.Second, apiServerTimeouts.idle)
	require.GreaterOrEqual(t, apiServerTimeouts.write, time.Minute)
	saved := apiServerTimeouts
	t.Cleanup(func() { apiServerTimeouts = saved })
	apiServerTimeouts.read = 500 * time.Millisecond

	db := testenv.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	require.Equal(t, 0, Main(ctx, []string{"ferry", "migrate", "--database-url", db}, &out, &errOut), errOut.String())

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	actx, stop := context.WithCancel(ctx)
	done := make(chan int, 1)
	go func() {
		done <- Main(actx, []string{"ferry", "api", "--database-url", db, "--addr", addr, "--log-level", "error"}, io.Discard, io.Discard)
	}()
	defer func() { stop(); <-done }()
	require.Eventually(t, func() bool {
		res, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	}, 30*time.Second, 50*time.Millisecond)

	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(15*time.Second)))
	_, err = io.WriteString(c, "POST /notifications HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{\"user_id\":")
	require.NoError(t, err)
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	require.NoError(t, err, "the server answers a stalled body instead of waiting for it")
	var obj map[string]any
	require.NoError(t, json.NewDecoder(res.Body).Decode(&obj))
	res.Body.Close()
	require.Equal(t, http.StatusRequestTimeout, res.StatusCode, "%v", obj)
	require.Equal(t, "request_timeout", obj["code"])
	_, err = br.ReadByte()
	require.ErrorIs(t, err, io.EOF, "the server closed the connection")
}
