package ferrycli

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// demoCounts are the demo's counters at one moment.
type demoCounts struct {
	lines    int // lines to post
	posted   int // lines posted (answered)
	accepted int
	rejected int
	sent     int
	dead     int
}

// progress draws the demo's progress: on a terminal one line redrawn in
// place (\r) with a bar; elsewhere (CI, a pipe) a plain line at most
// every interval, only when the counters changed.
type progress struct {
	w        io.Writer
	tty      bool
	start    time.Time
	interval time.Duration
	lastAt   time.Time
	last     demoCounts
	drawn    bool
	width    int
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func newProgress(w io.Writer, start time.Time) *progress {
	return &progress{w: w, tty: isTerminal(w), start: start, interval: 2 * time.Second, width: 30}
}

// line renders the counters: the bar fills with the notifications in a
// final state (sent or dead) out of those accepted so far.
func (p *progress) line(c demoCounts, now time.Time) string {
	done := c.sent + c.dead
	frac := 0.0
	if c.accepted > 0 {
		frac = float64(done) / float64(c.accepted)
	}
	if c.posted < c.lines && frac > 0 {
		// Still posting: more will be accepted, so the bar cannot be full.
		frac = frac * float64(c.posted) / float64(c.lines)
	}
	filled := int(frac * float64(p.width))
	bar := strings.Repeat("█", filled) + strings.Repeat("░", p.width-filled)
	return fmt.Sprintf("%s %3.0f%%  posted %d/%d  accepted %d  rejected %d  sent %d  dead %d  %.1fs",
		bar, 100*frac, c.posted, c.lines, c.accepted, c.rejected, c.sent, c.dead, now.Sub(p.start).Seconds())
}

// update draws c when it is time to.
func (p *progress) update(c demoCounts) {
	now := time.Now()
	if p.tty {
		fmt.Fprintf(p.w, "\r%s\x1b[K", p.line(c, now))
		p.drawn = true
		return
	}
	if (c == p.last && p.drawn) || now.Sub(p.lastAt) < p.interval {
		return
	}
	p.last, p.lastAt, p.drawn = c, now, true
	fmt.Fprintln(p.w, p.line(c, now))
}

// finish draws c a last time and ends the line.
func (p *progress) finish(c demoCounts) {
	line := p.line(c, time.Now())
	if p.tty {
		fmt.Fprintf(p.w, "\r%s\x1b[K\n", line)
		return
	}
	if !p.drawn || c != p.last {
		fmt.Fprintln(p.w, line)
	}
}
