package latencyproxy_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/internal/latencyproxy"
)

// backend is an HTTP server that answers "ok:<body>" and counts what it
// received.
type backend struct {
	*httptest.Server
	got atomic.Int64
}

func newBackend(t *testing.T, h func(w http.ResponseWriter, r *http.Request)) *backend {
	t.Helper()
	b := &backend{}
	b.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.got.Add(1)
		if h != nil {
			h(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		_, _ = io.WriteString(w, "ok:"+string(body))
	}))
	t.Cleanup(b.Close)
	return b
}

func startProxy(t *testing.T, target string, delay time.Duration) *latencyproxy.Proxy {
	t.Helper()
	p, err := latencyproxy.Start(target, delay)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func call(t *testing.T, ctx context.Context, url, target, body string) (int, string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	if target != "" {
		req.Header.Set("X-Amz-Target", target)
		req.Header.Set("Content-Type", "application/x-amz-json-1.0")
	} else {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// TestDelaysForwardsAndCounts: a request reaches the server unchanged
// after at least the delay, and is counted by the operation its
// X-Amz-Target (JSON protocol) or Action (query protocol, in a form body,
// which must still reach the server whole) names.
func TestDelaysForwardsAndCounts(t *testing.T) {
	t.Parallel()
	be := newBackend(t, nil)
	const delay = 40 * time.Millisecond
	p := startProxy(t, be.URL, delay)
	require.True(t, strings.HasPrefix(p.URL(), "http://127.0.0.1:"), p.URL())
	require.Equal(t, delay, p.Delay())

	start := time.Now()
	code, body, err := call(t, context.Background(), p.URL(), "AmazonSQS.SendMessageBatch", `{"QueueUrl":"q"}`)
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Since(start), delay, "the call was held for the delay")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, `ok:{"QueueUrl":"q"}`, body)

	form := "Action=ReceiveMessage&QueueUrl=q&MaxNumberOfMessages=10"
	_, body, err = call(t, context.Background(), p.URL(), "", form)
	require.NoError(t, err)
	require.Equal(t, "ok:"+form, body, "the form body read for its Action is forwarded whole")
	_, _, err = call(t, context.Background(), p.URL()+"/?Action=ListQueues", "", "")
	require.NoError(t, err)
	_, _, err = call(t, context.Background(), p.URL(), "", "nothing=here")
	require.NoError(t, err)

	require.Equal(t, map[string]int64{"SendMessageBatch": 1, "ReceiveMessage": 1, "ListQueues": 1, "unknown": 1}, p.Calls())
	require.Equal(t, "ListQueues 1, ReceiveMessage 1, SendMessageBatch 1, unknown 1", latencyproxy.FormatCalls(p.Calls()))
	p.ResetCalls()
	require.Empty(t, p.Calls())
	p.SetDelay(-time.Second)
	require.Equal(t, time.Duration(0), p.Delay())
}

// TestCallsInFlightAtOnce: the proxy holds and forwards requests
// concurrently: a server that answers only once 16 requests are waiting
// at the same time gets them all (a proxy that served one request at a
// time would never get there, and the calls would fail at their 30 s
// deadline).
func TestCallsInFlightAtOnce(t *testing.T) {
	t.Parallel()
	const n = 16
	var (
		mu      sync.Mutex
		waiting int
		all     = make(chan struct{})
	)
	be := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		if waiting++; waiting == n {
			close(all)
		}
		mu.Unlock()
		select {
		case <-all:
			_, _ = io.WriteString(w, "ok")
		case <-r.Context().Done():
		}
	})
	p := startProxy(t, be.URL, 20*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			code, _, err := call(t, ctx, p.URL(), "AmazonSQS.ReceiveMessage", "{}")
			if err == nil && code != http.StatusOK {
				err = io.ErrUnexpectedEOF
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int64(n), p.Calls()["ReceiveMessage"])
}

// TestClientGoneDuringDelayIsNotForwarded: a call whose client gives up
// while the proxy holds it never reaches the server, not even once the
// delay is over.
func TestClientGoneDuringDelayIsNotForwarded(t *testing.T) {
	t.Parallel()
	be := newBackend(t, nil)
	const delay = 200 * time.Millisecond
	p, err := latencyproxy.Start(be.URL, delay)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, _, err := call(t, ctx, p.URL(), "AmazonSQS.DeleteMessageBatch", "{}")
		done <- err
	}()
	require.Eventually(t, func() bool { return p.Calls()["DeleteMessageBatch"] == 1 }, 10*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	time.Sleep(5 * delay) // well past the delay: a proxy that forwarded anyway would have by now
	require.Zero(t, be.got.Load(), "the server never saw the call")
	require.NoError(t, p.Close())
	require.NoError(t, p.Close(), "a second Close")
}

// TestServerDownIsBadGateway: with nothing listening at the target, a
// call gets HTTP 502 naming the proxy, as an unreachable endpoint would
// fail the client's call.
func TestServerDownIsBadGateway(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	p := startProxy(t, "http://"+addr, 0)
	code, body, err := call(t, context.Background(), p.URL(), "AmazonSQS.SendMessageBatch", "{}")
	require.NoError(t, err)
	require.Equal(t, http.StatusBadGateway, code)
	require.Contains(t, body, "latencyproxy:")
}

func TestStartRefusesBadArguments(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		target string
		delay  time.Duration
		want   string
	}{
		{"127.0.0.1:9324", 0, "latencyproxy: target"},
		{"ftp://127.0.0.1:9324", 0, "want an http:// or https:// URL"},
		{"http://", 0, "want an http:// or https:// URL"},
		{"http://127.0.0.1:9324", -time.Millisecond, "must not be negative"},
		{"http://[::1", 0, "latencyproxy: target"},
	} {
		p, err := latencyproxy.Start(tc.target, tc.delay)
		require.ErrorContains(t, err, tc.want, tc.target)
		require.Nil(t, p)
	}
}
