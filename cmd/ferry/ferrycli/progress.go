package ferrycli

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/term"
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

// progress draws the demo's progress bar: on a terminal one line redrawn
// in place (\r) with a bar. Elsewhere (CI, a pipe, a file) it draws
// nothing, and the summary that follows says everything.
type progress struct {
	w     io.Writer
	tty   bool
	start time.Time
	width int
}

// isTerminal reports whether w is a terminal (golang.org/x/term; a
// character device such as /dev/null is not one).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func newProgress(w io.Writer, start time.Time) *progress {
	return &progress{w: w, tty: isTerminal(w), start: start, width: 30}
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

// update redraws c on a terminal.
func (p *progress) update(c demoCounts) {
	if !p.tty {
		return
	}
	fmt.Fprintf(p.w, "\r%s\x1b[K", p.line(c, time.Now()))
}

// finish draws c a last time on a terminal and ends the line.
func (p *progress) finish(c demoCounts) {
	if !p.tty {
		return
	}
	fmt.Fprintf(p.w, "\r%s\x1b[K\n", p.line(c, time.Now()))
}
