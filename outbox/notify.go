package outbox

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultNotifyWindow is the default of SetNotifyWindow: within one
// process, at most one Enqueue per database sends the NOTIFY in any 2 ms.
const DefaultNotifyWindow = 2 * time.Millisecond

// notifyWindow is SetNotifyWindow's value, in nanoseconds.
var notifyWindow atomic.Int64

func init() { notifyWindow.Store(int64(DefaultNotifyWindow)) }

// SetNotifyWindow sets how often Enqueue sends its NOTIFY, for the whole
// process: an Enqueue notifies only when no Enqueue on the same database
// (host, port and database name) chose to notify in the last d; the others
// rely on the relay's follow-up claims (see the package documentation,
// "Latency"). Zero makes every Enqueue notify, as PostgreSQL's commit of a
// notifying transaction holds a database-wide lock from pre-commit through
// the WAL flush, which serializes the commits of concurrent producers
// (BenchmarkCreate in package bench). d must not be negative (an error
// wrapping ErrInvalidConfig); the default is DefaultNotifyWindow. Safe to
// call at any time, from any goroutine; it returns the previous window.
func SetNotifyWindow(d time.Duration) (time.Duration, error) {
	if d < 0 {
		return 0, fmt.Errorf("%w: notify window %v: must not be negative", ErrInvalidConfig, d)
	}
	return time.Duration(notifyWindow.Swap(int64(d))), nil
}

// NotifyWindow returns the window set by SetNotifyWindow (the default is
// DefaultNotifyWindow).
func NotifyWindow() time.Duration { return time.Duration(notifyWindow.Load()) }

// notifyLimiter remembers when an Enqueue on one database last chose to
// notify (after River's notifylimiter).
type notifyLimiter struct {
	mu   sync.Mutex
	last time.Time
}

// limiters maps "host:port/database" to its *notifyLimiter.
var limiters sync.Map

// limiterKey is the key of a connection's *notifyLimiter in
// pgconn.PgConn.CustomData, so the limiter is looked up once per
// connection, not per Enqueue.
const limiterKey = "github.com/ferrymq/ferry/outbox.notifyLimiter"

// shouldNotify reports whether an Enqueue in tx sends the NOTIFY, and if
// so records it as the latest notification on tx's database and returns
// a function that forgets it (for an Enqueue that failed, so the next one
// notifies instead).
func shouldNotify(tx pgx.Tx) (notify bool, forget func()) {
	noop := func() {}
	window := time.Duration(notifyWindow.Load())
	if window <= 0 {
		return true, noop
	}
	conn := tx.Conn()
	if conn == nil || conn.PgConn() == nil {
		return true, noop
	}
	data := conn.PgConn().CustomData()
	l, _ := data[limiterKey].(*notifyLimiter)
	if l == nil {
		cfg := conn.Config()
		v, _ := limiters.LoadOrStore(fmt.Sprintf("%s:%d/%s", cfg.Host, cfg.Port, cfg.Database), &notifyLimiter{})
		l = v.(*notifyLimiter)
		if data != nil {
			data[limiterKey] = l
		}
	}
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.last) < window {
		return false, noop
	}
	prev := l.last
	l.last = now
	return true, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.last.Equal(now) {
			l.last = prev
		}
	}
}
