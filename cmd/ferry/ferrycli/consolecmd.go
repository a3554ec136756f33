package ferrycli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"

	"github.com/urfave/cli/v2"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/console"
)

const (
	flagConsoleAddr     = "console-addr"
	flagConsoleToken    = "console-token"
	flagConsoleReadOnly = "console-read-only"
	flagConsoleHold     = "console-hold"
	catConsole          = "Web console"
)

// DefaultConsoleAddr is `ferry console --addr`'s default: loopback.
const DefaultConsoleAddr = "127.0.0.1:8080"

// consoleFlags: the token and read-only mode of the web console, for
// ferry console, run and demo; run and demo also take --console-addr
// (withAddr), where the console listens next to the API.
func consoleFlags(withAddr bool) []cli.Flag {
	f := []cli.Flag{
		&cli.StringFlag{Name: flagConsoleToken, EnvVars: env(flagConsoleToken), Category: catConsole,
			Usage: "token every console action (replay, purge, retry, drop) needs; without it actions are refused, and only loopback clients may read"},
		&cli.BoolFlag{Name: flagConsoleReadOnly, EnvVars: env(flagConsoleReadOnly), Category: catConsole, Usage: "console: hide and refuse every action"},
	}
	if withAddr {
		f = append([]cli.Flag{&cli.StringFlag{Name: flagConsoleAddr, Value: "127.0.0.1:0", EnvVars: env(flagConsoleAddr), Category: catConsole,
			Usage: "web console's listen address (port 0: a free port, printed); off: no console"}}, f...)
	}
	return f
}

func consoleCommand() *cli.Command {
	return &cli.Command{
		Name: "console",
		Usage: "serve the web console: outbox backlog and rates, parked rows, the DLQ of --queue grouped by last error, a job's story; " +
			"retry/drop and replay/purge with --console-token",
		Flags: concat(databaseFlags(false), dlqFlags("info", true),
			// --console-addr (FERRY_CONSOLE_ADDR, as for run and demo), --addr
			// for short; not the API's --addr and FERRY_ADDR: one variable,
			// one meaning.
			[]cli.Flag{&cli.StringFlag{Name: flagConsoleAddr, Aliases: []string{flagAddr}, Value: DefaultConsoleAddr, EnvVars: env(flagConsoleAddr), Category: catConsole,
				Usage: "listen address, host:port (loopback by default); an empty value is refused"}},
			consoleFlags(false), shutdownFlags()),
		Action: runConsoleCommand,
	}
}

// consoleOpts is how run and demo serve the console next to their roles.
type consoleOpts struct {
	addr, token string
	readOnly    bool
	// ready receives the console's URL once it listens.
	ready   func(url string)
	figures func(ctx context.Context) ([]console.Figure, error)
}

// loadConsoleOpts reads --console-addr, --console-token and
// --console-read-only; nil when --console-addr is off.
func loadConsoleOpts(c *cli.Context) *consoleOpts {
	addr := c.String(flagConsoleAddr)
	if addr == "off" {
		return nil
	}
	return &consoleOpts{addr: addr, token: c.String(flagConsoleToken), readOnly: c.Bool(flagConsoleReadOnly)}
}

func runConsoleCommand(c *cli.Context) error {
	s, log, err := setup(c, "info")
	if err != nil {
		return err
	}
	st, err := openMigratedStack(c.Context, s, log)
	if err != nil {
		return err
	}
	defer st.close()
	// The same connection as the dlq commands': it declares nothing. A
	// broker that does not answer (an outage, when the page matters most)
	// leaves the outbox pages up and the DLQ pages off; a wrong setting
	// (a flag, the credentials, an unknown queue) stops here.
	b, _, err := openDLQ(c, s, log)
	switch {
	case err == nil:
		defer b.Close()
	case isUsageError(err) || namesFlag(err) || broker.IsPermanent(err) || errors.Is(err, broker.ErrUnknownQueue):
		return err
	default:
		log.Warn("console: the broker does not answer; serving the outbox pages, the DLQ pages are off until ferry console is started again", "error", err)
		b = nil
	}
	o := &consoleOpts{addr: c.String(flagConsoleAddr), token: c.String(flagConsoleToken), readOnly: c.Bool(flagConsoleReadOnly),
		ready: func(url string) { fmt.Fprintf(c.App.Writer, "ferry console: %s\n", url) }}
	return ignoreCanceled(c.Context, st.serveConsole(c.Context, o, b, s.exchange, s.queue))
}

// runConsole serves the console of run and demo: its own broker
// connection, which declares nothing (the relay and the worker do).
func (st *stack) runConsole(ctx context.Context, o *consoleOpts) error {
	opts := st.brokerOptions("console")
	b, err := OpenBroker(ctx, st.s.broker, opts)
	if err != nil {
		if ctx.Err() != nil {
			return nil // the roles are stopping (the demo gave up on the broker)
		}
		// The relay and the worker wait for the broker and say why, at
		// WARN, and the demo gives up with one precise line: the console,
		// which serves the outbox pages without it, says so at INFO (a
		// WARN of its own came first on the demo's stderr).
		st.log.Info("console: no broker connection, the DLQ pages are off", "error", err)
		b = nil
	}
	if b != nil {
		defer b.Close()
	}
	return st.serveConsole(ctx, o, b, st.topology().Exchange, st.app.Queue())
}

// serveConsole serves the console on o.addr until ctx is done.
func (st *stack) serveConsole(ctx context.Context, o *consoleOpts, b broker.Broker, exchange, queue string) error {
	h, err := console.New(console.Config{
		Pool: st.pool, Broker: b, BrokerName: st.s.broker, Exchange: exchange, Queues: []string{queue},
		Token: o.token, ReadOnly: o.readOnly, Logger: st.log.With("component", "console"), Figures: o.figures,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fmt.Errorf("ferry: console: listen %s: %w", o.addr, err)
	}
	srv := newAPIServer(h, st.log)
	url := "http://" + ln.Addr().String() + "/"
	st.log.Info("console listening", "url", url, "read_only", o.readOnly, "actions", o.token != "" && !o.readOnly)
	if o.ready != nil {
		o.ready(url)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("ferry: console: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), st.s.shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("ferry: console: shutdown: %w", err)
	}
	return nil
}
