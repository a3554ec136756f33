package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferrymq/ferry/broker"
)

// connMgr keeps one AMQP connection open: it dials, re-declares the
// topology, hands the connection out, and redials after a loss, every
// ReconnectDelay, until the adapter is closed.
type connMgr struct {
	r    *rabbit
	role string

	mu      sync.Mutex
	conn    *amqp.Connection // nil while disconnected
	ready   chan struct{}    // closed while conn is set
	lastErr error
	// connected is set once a dial succeeded; before that a refusal
	// (refusedErr) ends the wait of New instead of being retried.
	connected  bool
	refused    chan struct{} // closed when refusedErr is set
	refusedErr error

	// blockedBy is the reason of the connection.blocked the server sent
	// on conn ("" while it is not blocked); blockedCh is closed when the
	// connection becomes blocked and replaced when it is unblocked or
	// replaced (see blocked).
	blockedBy string
	blockedCh chan struct{}

	// next is the index in Config.urls() of the node the next dial tries
	// first; at is the node of the current connection. Only run touches
	// them.
	next, at int
}

func newConnMgr(r *rabbit, role string) *connMgr {
	return &connMgr{r: r, role: role, ready: make(chan struct{}), refused: make(chan struct{}), blockedCh: make(chan struct{})}
}

// blocked returns the reason the server gave in connection.blocked for
// the current connection ("" when it is not blocked), and a channel that
// is closed when the connection becomes blocked (already closed when it
// is). RabbitMQ sends connection.blocked when a memory or disk alarm goes
// off and stops reading from the connection's socket until
// connection.unblocked (RabbitMQ docs, "Blocked Connection
// Notifications"): a publish then gets no confirm until the alarm clears.
func (m *connMgr) blocked() (string, <-chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.blockedBy, m.blockedCh
}

// setBlocked records a connection.blocked or connection.unblocked of
// conn; it is ignored when conn is no longer the current connection.
func (m *connMgr) setBlocked(conn *amqp.Connection, b amqp.Blocking, log *slog.Logger) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.conn != conn {
		return
	}
	switch {
	case b.Active && m.blockedBy == "":
		m.blockedBy = b.Reason
		if m.blockedBy == "" {
			m.blockedBy = "connection blocked by the server"
		}
		close(m.blockedCh)
		log.Warn("rabbitmq: connection blocked by the server (resource alarm); publishes fail with broker.ErrBlocked until it clears", "reason", m.blockedBy)
	case !b.Active && m.blockedBy != "":
		m.blockedBy = ""
		m.blockedCh = make(chan struct{})
		log.Info("rabbitmq: connection unblocked by the server")
	}
}

// clearBlocked forgets the blocked state of a connection that is gone; m.mu
// is held.
func (m *connMgr) clearBlocked() {
	if m.blockedBy != "" {
		m.blockedBy = ""
		m.blockedCh = make(chan struct{})
	}
}

func (m *connMgr) lastError() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lastErr
}

// current returns the open connection, waiting for a reconnection while
// there is none. It returns ctx's error, ErrClosed, or, when the server
// refused the first connection (see refusal), an error wrapping
// broker.ErrRefused.
func (m *connMgr) current(ctx context.Context) (*amqp.Connection, error) {
	for {
		if m.r.closed.Load() {
			return nil, broker.ErrClosed
		}
		m.mu.Lock()
		conn, ready := m.conn, m.ready
		m.mu.Unlock()
		if conn != nil && !conn.IsClosed() {
			return conn, nil
		}
		wait := ready
		if conn != nil {
			// Lost but not yet noticed by run: poll briefly.
			t := time.NewTimer(20 * time.Millisecond)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			case <-m.r.closing:
				t.Stop()
				return nil, broker.ErrClosed
			}
			continue
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-m.r.closing:
			return nil, broker.ErrClosed
		case <-m.refused:
			return nil, fmt.Errorf("%w: %w", broker.ErrRefused, m.refusedErr)
		}
	}
}

// dial connects to the first node of Config.URL that answers, starting
// at m.next and going round the list once; it returns the error of the
// last node tried. A refusal (refusal) is returned at once: every node of
// a cluster shares its users, so the next one would refuse too.
func (m *connMgr) dial() (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(m.r.cfg.ConnectionName + "-" + m.role)
	urls := m.r.cfg.urls()
	var err error
	for i := range urls {
		idx := (m.next + i) % len(urls)
		var conn *amqp.Connection
		conn, err = amqp.DialConfig(urls[idx], amqp.Config{
			Heartbeat:  m.r.cfg.Heartbeat,
			Locale:     "en_US",
			Properties: props,
			Dial:       amqp.DefaultDial(5 * time.Second),
		})
		if err == nil {
			m.at = idx
			return conn, nil
		}
		if refusal(err) || m.r.closed.Load() {
			return nil, err
		}
	}
	return nil, err
}

// sleep waits d or until the adapter closes; false when closed.
func (m *connMgr) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-m.r.closing:
		return false
	}
}

func (m *connMgr) run() {
	defer m.r.wg.Done()
	log := m.r.log.With("connection", m.role)
	failures := 0
	lost := false // a connection was lost and not yet replaced
	for {
		if m.r.closed.Load() {
			return
		}
		conn, err := m.dial()
		if err == nil {
			if t := m.r.topology(); t != nil {
				if derr := declareOn(conn, *t, m.r.cfg.QueueType, m.r.cfg.QuorumReplicas, log); derr != nil {
					// The topology was accepted before; a refusal now is
					// logged, and the connection used for what still works.
					log.Error("rabbitmq: re-declare after reconnect failed", "err", derr)
				}
			}
		}
		if err != nil {
			m.mu.Lock()
			m.lastErr = err
			first := !m.connected
			refused := first && refusal(err)
			if refused && m.refusedErr == nil {
				// New returns this error; nothing to wait for.
				m.refusedErr = err
				close(m.refused)
			}
			m.mu.Unlock()
			// A refused first login is not a retry: New returns it and
			// closes the adapter (ferry exits 1 with it), so no
			// "retrying" line.
			if first && !refused {
				// New returns the last dial error itself, so its caller
				// decides whether that is worth a warning; INFO shows the
				// wait meanwhile.
				if failures == 0 || failures%20 == 0 {
					log.Info("rabbitmq: dial failed; retrying", "url", redact(m.r.cfg.URL), "err", err, "attempt", failures+1)
				}
			} else if !first && (failures == 0 || failures%20 == 0) {
				log.Warn("rabbitmq: dial failed; retrying", "url", redact(m.r.cfg.URL), "err", err, "attempt", failures+1)
			}
			failures++
			if !m.sleep(m.r.cfg.ReconnectDelay) {
				return
			}
			continue
		}
		if lost || failures > 0 {
			// Every "connection lost" is followed by one "reconnected",
			// also when the first dial succeeds.
			log.Info("rabbitmq: reconnected", "dial_attempts", failures+1, "url", redact(m.r.cfg.urls()[m.at]))
		}
		failures = 0
		lost = false
		closed := conn.NotifyClose(make(chan *amqp.Error, 1))
		// amqp091 hands connection.blocked/unblocked over with a blocking
		// send from its reader and closes the channel with the
		// connection: drain it until then.
		blocks := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
		go func(conn *amqp.Connection) {
			for b := range blocks {
				m.setBlocked(conn, b, log)
			}
		}(conn)
		m.mu.Lock()
		m.clearBlocked()
		m.conn = conn
		m.connected = true
		m.lastErr = nil
		close(m.ready)
		m.mu.Unlock()

		select {
		case e := <-closed:
			lost = true
			// The node is likely gone: try the next one first.
			m.next = (m.at + 1) % len(m.r.cfg.urls())
			if e != nil {
				log.Warn("rabbitmq: connection lost; reconnecting", "err", e)
			} else {
				log.Warn("rabbitmq: connection closed; reconnecting")
			}
			m.mu.Lock()
			m.conn = nil
			m.clearBlocked()
			m.ready = make(chan struct{})
			m.mu.Unlock()
		case <-m.r.closing:
			m.mu.Lock()
			m.conn = nil
			m.mu.Unlock()
			if err := conn.CloseDeadline(time.Now().Add(2 * time.Second)); err != nil && !errors.Is(err, amqp.ErrClosed) {
				log.Debug("rabbitmq: close connection", "err", err)
			}
			return
		}
	}
}
