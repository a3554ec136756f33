// Package latencyproxy is a loopback HTTP reverse proxy that holds every
// request for a fixed delay before forwarding it, and counts the requests
// by SQS operation. Put in front of a local SQS server (ElasticMQ, moto)
// with a delay of 15 ms, it gives a client the round trip AWS SQS costs
// from inside its region (10 to 20 ms a call), so a benchmark measures how
// throughput grows with the calls a client keeps in flight, which a
// server on loopback (well under a millisecond a call) never shows.
//
// It is a net/http/httputil.ReverseProxy on 127.0.0.1 with an idle
// connection pool large enough for every call in flight, so the proxy
// itself opens no connection per call. The delay is added once per
// request, after the proxy has read it whole and before it forwards it; a
// request whose client gives up during the delay is not forwarded. The benchmarks (bench, ferry bench's
// --sqs-latency) use it; it is no part of a production path.
package latencyproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// maxIdle is the proxy's idle connections to the server: more than the
// calls a benchmark keeps in flight, so each call reuses one.
const maxIdle = 1024

// maxFormBody is the largest form-encoded body (SQS's query protocol) the
// proxy reads to find its Action; a larger one is counted as "unknown".
const maxFormBody = 1 << 20

// Proxy is a running delay proxy. Its methods may be called concurrently.
type Proxy struct {
	url    string
	delay  atomic.Int64 // nanoseconds
	srv    *http.Server
	ln     net.Listener
	done   chan struct{}
	mu     sync.Mutex
	calls  map[string]int64
	closed bool
}

// Start listens on a free port of 127.0.0.1 and forwards every request to
// target (an http:// URL such as http://127.0.0.1:9324) after delay.
// delay must not be negative. It returns an error for a target that is not
// an http:// or https:// URL with a host, or when it cannot listen.
func Start(target string, delay time.Duration) (*Proxy, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("latencyproxy: target %q: %w", target, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("latencyproxy: target %q: want an http:// or https:// URL with a host", target)
	}
	if delay < 0 {
		return nil, fmt.Errorf("latencyproxy: delay %v: must not be negative", delay)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("latencyproxy: listen: %w", err)
	}
	p := &Proxy{url: "http://" + ln.Addr().String(), ln: ln, done: make(chan struct{}), calls: map[string]int64{}}
	p.delay.Store(int64(delay))
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil // loopback to loopback, whatever HTTP_PROXY says
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = maxIdle, maxIdle
	rp := &httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(u); r.Out.Host = u.Host },
		Transport: tr,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the client went away: nobody reads the answer
			}
			http.Error(w, "latencyproxy: "+err.Error(), http.StatusBadGateway)
		},
	}
	p.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The whole request first: the server notices a client that
		// goes away (and cancels r's context) only once the body is read.
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return // the client went away mid-request
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		p.count(r)
		if d := time.Duration(p.delay.Load()); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
				return
			}
		}
		rp.ServeHTTP(w, r)
	}), ReadHeaderTimeout: time.Minute}
	go func() {
		defer close(p.done)
		_ = p.srv.Serve(ln) // ErrServerClosed after Close
	}()
	return p, nil
}

// URL is the proxy's address, such as http://127.0.0.1:41234: the
// endpoint to give the client instead of the target's.
func (p *Proxy) URL() string { return p.url }

// Delay is the delay added to each request.
func (p *Proxy) Delay() time.Duration { return time.Duration(p.delay.Load()) }

// SetDelay changes the delay of the requests that arrive from now on;
// negative is taken as 0.
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(max(d, 0))) }

// Calls returns the requests received so far by operation: the SQS
// operation named by the X-Amz-Target header of the JSON protocol
// ("AmazonSQS.SendMessageBatch" counts as "SendMessageBatch") or by the
// Action parameter of the query protocol, else "unknown". Each HTTP
// request counts, so an SDK's retry of a call counts again.
func (p *Proxy) Calls() map[string]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int64, len(p.calls))
	for k, v := range p.calls {
		out[k] = v
	}
	return out
}

// ResetCalls sets every count of Calls to zero.
func (p *Proxy) ResetCalls() {
	p.mu.Lock()
	p.calls = map[string]int64{}
	p.mu.Unlock()
}

// Close stops listening and waits up to 5 s for the requests in flight
// (held or forwarded) to be answered, then cuts the rest. A second Close
// returns nil.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := p.srv.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = p.srv.Close()
	}
	<-p.done
	return err
}

func (p *Proxy) count(r *http.Request) {
	op := Operation(r)
	p.mu.Lock()
	p.calls[op]++
	p.mu.Unlock()
}

// Operation names the SQS operation of r: the part after the last '.' of
// its X-Amz-Target header (the JSON protocol, which aws-sdk-go-v2's
// service/sqs speaks), else its Action parameter (the query protocol, in
// the URL or a form-encoded body, which it reads and puts back), else
// "unknown".
func Operation(r *http.Request) string {
	if t := r.Header.Get("X-Amz-Target"); t != "" {
		return t[strings.LastIndexByte(t, '.')+1:]
	}
	if a := r.URL.Query().Get("Action"); a != "" {
		return a
	}
	if r.Body != nil && strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded") {
		body, err := io.ReadAll(io.LimitReader(r.Body, maxFormBody+1))
		rest := r.Body
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(body), rest), rest}
		if err == nil && len(body) <= maxFormBody {
			if v, err := url.ParseQuery(string(body)); err == nil && v.Get("Action") != "" {
				return v.Get("Action")
			}
		}
	}
	return "unknown"
}

// FormatCalls writes calls as "Op1 n1, Op2 n2" in the order of the
// operation names.
func FormatCalls(calls map[string]int64) string {
	ops := make([]string, 0, len(calls))
	for op := range calls {
		ops = append(ops, op)
	}
	sort.Strings(ops)
	parts := make([]string, len(ops))
	for i, op := range ops {
		parts[i] = fmt.Sprintf("%s %d", op, calls[op])
	}
	return strings.Join(parts, ", ")
}
