package suite

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// bar draws the progress of one scenario run: on a terminal one line
// redrawn in place, elsewhere (CI, a pipe) a plain line at most every
// 2 s and a last one at the end.
type bar struct {
	w      io.Writer
	tty    bool
	label  string
	total  int64
	start  time.Time
	lastAt time.Time
	last   int64
	drawn  bool
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func (r *runner) newBar(label string, total int) *bar {
	return &bar{w: r.cfg.Progress, tty: isTerminal(r.cfg.Progress), label: label, total: int64(total), start: time.Now()}
}

func (b *bar) line(done int64) string {
	frac := 0.0
	if b.total > 0 {
		frac = min(float64(done)/float64(b.total), 1)
	}
	const width = 30
	filled := int(frac * width)
	return fmt.Sprintf("  %-28s %s %3.0f%% %d/%d %.1fs", b.label, strings.Repeat("█", filled)+strings.Repeat("░", width-filled),
		100*frac, done, b.total, time.Since(b.start).Seconds())
}

// update draws done when it is time to.
func (b *bar) update(done int64) {
	if b.tty {
		fmt.Fprintf(b.w, "\r%s\x1b[K", b.line(done))
		b.drawn = true
		return
	}
	if time.Since(b.lastAt) < 2*time.Second || (b.drawn && done == b.last) {
		return
	}
	b.lastAt, b.last, b.drawn = time.Now(), done, true
	fmt.Fprintln(b.w, b.line(done))
}

// finish draws done a last time and ends the line.
func (b *bar) finish(done int64) {
	if b.tty {
		fmt.Fprintf(b.w, "\r%s\x1b[K\n", b.line(done))
		return
	}
	fmt.Fprintln(b.w, b.line(done))
}
