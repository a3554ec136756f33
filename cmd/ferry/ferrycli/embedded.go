package ferrycli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"

	"github.com/emersion/go-smtp"
)

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("ferry: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// embeddedNATS is a nats-server with JetStream running inside the ferry
// process, listening on a random loopback port.
type embeddedNATS struct {
	srv *natsserver.Server
	dir string
}

// startEmbeddedNATS starts nats-server with JetStream storing in
// dir/nats (dir is created when missing).
func startEmbeddedNATS(dir string) (*embeddedNATS, error) {
	store := filepath.Join(dir, "nats")
	if err := os.MkdirAll(store, 0o755); err != nil {
		return nil, fmt.Errorf("ferry: embedded NATS: %w", err)
	}
	opts := &natsserver.Options{
		ServerName:             "ferry-embedded",
		Host:                   "127.0.0.1",
		Port:                   natsserver.RANDOM_PORT,
		JetStream:              true,
		StoreDir:               store,
		NoSigs:                 true,
		NoLog:                  true,
		DisableJetStreamBanner: true,
		MaxPayload:             8 << 20,
	}
	srv, err := natsserver.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("ferry: embedded NATS: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(15 * time.Second) {
		srv.Shutdown()
		return nil, errors.New("ferry: embedded NATS: not ready for connections after 15s")
	}
	return &embeddedNATS{srv: srv, dir: store}, nil
}

// URL is the nats:// URL clients connect to.
func (e *embeddedNATS) URL() string { return e.srv.ClientURL() }

// Stop shuts the server down and waits for it.
func (e *embeddedNATS) Stop() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}

// smtpSink is a real SMTP server on a loopback port that accepts every
// message and counts it; with a folder it also stores each message there
// as an .eml file. It lets the demo run the same SMTP client path as
// production without any mail server installed.
type smtpSink struct {
	srv      *smtp.Server
	addr     string
	dir      string
	prefix   string // file name prefix, so a later run adds files
	messages atomic.Int64
	bytes    atomic.Int64
	wg       sync.WaitGroup
}

// startSMTPSink listens on 127.0.0.1:0; dir, when not empty, receives one
// .eml file per message.
func startSMTPSink(dir string) (*smtpSink, error) {
	if dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("ferry: SMTP sink: %w", err)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("ferry: SMTP sink: %w", err)
	}
	s := &smtpSink{addr: l.Addr().String(), dir: dir, prefix: time.Now().UTC().Format("20060102T150405")}
	srv := smtp.NewServer(smtp.BackendFunc(func(*smtp.Conn) (smtp.Session, error) {
		return &sinkSession{sink: s}, nil
	}))
	srv.Domain = "localhost"
	srv.MaxMessageBytes = 32 << 20
	srv.MaxRecipients = 100
	srv.AllowInsecureAuth = true
	srv.EnableSMTPUTF8 = true
	srv.ReadTimeout = time.Minute
	srv.WriteTimeout = time.Minute
	srv.ErrorLog = slogPrinter{}
	s.srv = srv
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = srv.Serve(l)
	}()
	return s, nil
}

// Addr is host:port of the sink.
func (s *smtpSink) Addr() string { return s.addr }

// Where describes where the mail went, for the demo summary.
func (s *smtpSink) Where() string {
	where := fmt.Sprintf("built-in SMTP sink on %s (in process): %d message(s), %s", s.addr, s.messages.Load(), humanBytes(s.bytes.Load()))
	if s.dir != "" {
		return where + ", stored as .eml in " + s.dir
	}
	return where + ", counted and discarded (give --data-dir to keep them, or --smtp-addr for a real server)"
}

// Stop closes the listener and the open connections.
func (s *smtpSink) Stop() {
	_ = s.srv.Close()
	s.wg.Wait()
}

type sinkSession struct {
	sink *smtpSink
}

func (*sinkSession) Reset()                               {}
func (*sinkSession) Logout() error                        { return nil }
func (*sinkSession) Mail(string, *smtp.MailOptions) error { return nil }
func (*sinkSession) Rcpt(string, *smtp.RcptOptions) error { return nil }
func (s *sinkSession) Data(r io.Reader) error {
	n := s.sink.messages.Add(1)
	var w io.Writer = io.Discard
	if s.sink.dir != "" {
		f, err := os.Create(filepath.Join(s.sink.dir, fmt.Sprintf("%s-%06d.eml", s.sink.prefix, n)))
		if err != nil {
			return fmt.Errorf("ferry: SMTP sink: %w", err)
		}
		defer f.Close()
		w = f
	}
	written, err := io.Copy(w, r)
	s.sink.bytes.Add(written)
	return err
}

// slogPrinter sends go-smtp's server log to slog at debug level.
type slogPrinter struct{}

func (slogPrinter) Printf(format string, v ...any) {
	slog.Debug("smtp sink: " + fmt.Sprintf(format, v...))
}
func (slogPrinter) Println(v ...any) { slog.Debug("smtp sink: " + fmt.Sprint(v...)) }

func humanBytes(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	default:
		return fmt.Sprintf("%d B", n)
	}
}

// stopper runs the registered stop functions in reverse order; used on every exit
// path so embedded servers never outlive the command.
type stopper struct {
	mu    sync.Mutex
	funcs []func()
}

func (s *stopper) add(f func()) {
	s.mu.Lock()
	s.funcs = append(s.funcs, f)
	s.mu.Unlock()
}

func (s *stopper) stop() {
	s.mu.Lock()
	funcs := s.funcs
	s.funcs = nil
	s.mu.Unlock()
	for i := len(funcs) - 1; i >= 0; i-- {
		funcs[i]()
	}
}
