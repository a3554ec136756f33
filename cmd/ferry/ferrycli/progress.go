package ferrycli

import (
	"fmt"
	"io"
	"time"

	"github.com/ferrymq/ferry/internal/progress"
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

// progressSteps is the resolution of the demo's bar: it shows a fraction
// (fraction), in thousandths.
const progressSteps = 1000

// demoProgress draws the demo's progress bar on a terminal (package
// internal/progress); elsewhere (CI, a pipe, a file) it draws nothing,
// and the summary that follows says everything.
type demoProgress struct {
	bar *progress.Bar
}

func newProgress(w io.Writer, _ time.Time) *demoProgress {
	return &demoProgress{bar: progress.NewStatus(w, progressSteps)}
}

// fraction is how far the demo is: the notifications in a final state
// (sent or dead) out of those accepted so far, scaled down while lines
// are still being posted (more will be accepted, so the bar cannot be
// full yet).
func (c demoCounts) fraction() float64 {
	done := c.sent + c.dead
	frac := 0.0
	if c.accepted > 0 {
		frac = float64(done) / float64(c.accepted)
	}
	if c.posted < c.lines && frac > 0 {
		frac = frac * float64(c.posted) / float64(c.lines)
	}
	return min(frac, 1)
}

// describe is the text beside the bar.
func (c demoCounts) describe() string {
	return fmt.Sprintf("posted %d/%d  accepted %d  rejected %d  sent %d  dead %d",
		c.posted, c.lines, c.accepted, c.rejected, c.sent, c.dead)
}

// update redraws c.
func (p *demoProgress) update(c demoCounts) {
	p.bar.Describe(c.describe())
	p.bar.Set(int64(c.fraction() * progressSteps))
}

// finish draws c a last time and ends the line.
func (p *demoProgress) finish(c demoCounts) {
	p.bar.Describe(c.describe())
	p.bar.Finish(int64(c.fraction() * progressSteps))
}
