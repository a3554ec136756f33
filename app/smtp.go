package app

import (
	"bytes"
	"context"
	"net"
	"sync"
	"time"
)

// The SMTP dialogue of one send honours the handler's ctx: when ctx is
// done the connection is closed, so a worker's shutdown does not wait for
// Config.SMTPTimeout. There is one exception. From the moment the client
// has written the end of the mail data ("\r\n.\r\n") until the server's
// final reply to it arrives, the server holds the whole mail and is
// deciding; closing then would leave the outcome unknown (the server may
// deliver it while the handler reports a failure, and the redelivery
// would send it again). In that window the abort waits for the reply,
// which is bounded by Config.SMTPDataTimeout (not Config.SMTPTimeout:
// RFC 5321 section 4.5.3.2.6 lets a server take up to 10 minutes to
// answer the end of the data); right after the reply the connection is
// closed without waiting for QUIT.
//
// The guard also moves the connection's deadline: go-mail sets one
// deadline of Config.SMTPTimeout when it connects; once the end of the
// data is written the guard extends it to Config.SMTPDataTimeout for the
// reply, and once the reply is in it sets it back to Config.SMTPTimeout
// (for QUIT). If the reply does not arrive (a timeout, a cut connection)
// the outcome is unknown: see ambiguous and ErrDeliveryUnknown.

// sendGuardKey is the context key under which send passes its sendGuard
// to dialSMTP.
type sendGuardKey struct{}

// sendGuard is the state of one SMTP dialogue, shared by the connection
// wrapper and the ctx watcher.
type sendGuard struct {
	// cmdTimeout and dataTimeout are Config.SMTPTimeout and
	// Config.SMTPDataTimeout; set before the dial, read-only after.
	cmdTimeout, dataTimeout time.Duration

	mu        sync.Mutex
	conn      net.Conn // the raw connection; nil until dialled
	cancelled bool     // ctx is done: close at the first safe point
	closed    bool     // conn was closed by the guard
	dataDone  bool     // the end-of-data marker has been written
	replied   bool     // the final reply line after it has arrived
	tail      []byte   // the last bytes written, to find the marker across writes
	reply     []byte   // bytes read after dataDone, until a final reply line
}

var endOfData = []byte("\r\n.\r\n")

// safeToClose reports whether closing now cannot lose a decision the
// server is making. Called with g.mu held.
func (g *sendGuard) safeToClose() bool { return !g.dataDone || g.replied }

// closeLocked closes the connection once. Called with g.mu held.
func (g *sendGuard) closeLocked() {
	if g.conn != nil && !g.closed {
		g.closed = true
		_ = g.conn.Close()
	}
}

// cancel is called when ctx is done.
func (g *sendGuard) cancel() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.cancelled = true
	if g.safeToClose() {
		g.closeLocked()
	}
}

// attach records the dialled connection; it closes it at once when ctx
// was done meanwhile.
func (g *sendGuard) attach(c net.Conn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.conn = c
	if g.cancelled {
		g.closeLocked()
	}
}

// aborted reports whether the guard closed the connection.
func (g *sendGuard) aborted() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}

// ambiguous reports whether the whole mail was (or may have been)
// written but the server's final reply to it has not arrived: a failure
// now leaves the server possibly holding the mail.
func (g *sendGuard) ambiguous() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.dataDone && !g.replied
}

// wrote notes the bytes about to be written; last reports that they hold
// the end of the mail data.
func (g *sendGuard) wrote(p []byte) (last bool, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false, net.ErrClosed
	}
	if g.dataDone || len(p) == 0 {
		return false, nil
	}
	// The marker may straddle two writes: look at the previous tail
	// joined with the head of p, then at p itself.
	head := p[:min(len(p), len(endOfData)-1)]
	if bytes.Contains(append(g.tail, head...), endOfData) || bytes.Contains(p, endOfData) {
		g.dataDone = true
		return true, nil
	}
	g.tail = append(g.tail, p[max(0, len(p)-(len(endOfData)-1)):]...)
	if n := len(g.tail); n > len(endOfData)-1 {
		g.tail = append(g.tail[:0], g.tail[n-(len(endOfData)-1):]...)
	}
	return false, nil
}

// read notes bytes read; once the final reply to the mail data is in,
// a pending cancel closes the connection. It reports whether p completed
// that reply.
func (g *sendGuard) read(p []byte) (replied bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.dataDone || g.replied || len(p) == 0 {
		return false
	}
	if len(g.reply) < 4<<10 {
		g.reply = append(g.reply, p...)
	}
	for rest := g.reply; ; {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			break
		}
		line := bytes.TrimRight(rest[:i], "\r")
		rest = rest[i+1:]
		// "250 ok" or "250": the last line of a reply; "250-..." continues.
		if len(line) == 3 || len(line) > 3 && line[3] == ' ' {
			g.replied = true
			break
		}
	}
	if g.replied && g.cancelled {
		g.closeLocked()
	}
	return g.replied
}

// guardedConn is the SMTP connection as go-mail sees it.
type guardedConn struct {
	net.Conn
	g *sendGuard
}

func (c *guardedConn) Write(p []byte) (int, error) {
	last, err := c.g.wrote(p)
	if err != nil {
		return 0, err
	}
	n, err := c.Conn.Write(p)
	if last && err == nil && c.g.dataTimeout > 0 {
		// The server has the whole mail and may take its time to answer
		// (RFC 5321 section 4.5.3.2.6: up to 10 minutes).
		_ = c.Conn.SetDeadline(time.Now().Add(c.g.dataTimeout))
	}
	return n, err
}

func (c *guardedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.g.read(p[:n]) && c.g.cmdTimeout > 0 {
		// The answer is in; QUIT gets the command timeout again.
		_ = c.Conn.SetDeadline(time.Now().Add(c.g.cmdTimeout))
	}
	return n, err
}

// dialSMTP is the mail client's dialer: a plain TCP dial whose connection
// is watched by the sendGuard that send put in ctx.
func dialSMTP(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	g, ok := ctx.Value(sendGuardKey{}).(*sendGuard)
	if !ok {
		return c, nil
	}
	g.attach(c)
	return &guardedConn{Conn: c, g: g}, nil
}
