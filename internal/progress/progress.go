// Package progress draws the progress bars of ferry's commands (ferry
// bench's scenario runs, ferry demo's notifications) with
// github.com/schollz/progressbar: on a terminal, one line redrawn in place;
// on anything else (a pipe, a file, CI's log) nothing at all, since the
// commands print their own summary lines and a log full of redrawn bars
// helps no one.
package progress

import (
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// Bar is one progress bar. Its methods may be called from one goroutine
// at a time; every method of a Bar drawn on no terminal (and of a nil
// *Bar) does nothing.
type Bar struct {
	pb *progressbar.ProgressBar
}

// IsTerminal reports whether w is a terminal (golang.org/x/term; a
// character device such as /dev/null is not one).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// New returns a bar of total steps (at least 1) labelled label, drawn on
// w when w is a terminal, at most every 100 ms, with the count of steps
// and the elapsed time.
func New(w io.Writer, label string, total int64) *Bar {
	return newBar(w, total, progressbar.OptionSetDescription(label), progressbar.OptionShowCount())
}

// NewStatus returns a bar of steps steps (at least 1) without a count,
// followed by a status line that Describe changes: a bar that shows a
// fraction of something whose total is still growing.
func NewStatus(w io.Writer, steps int64) *Bar {
	return newBar(w, steps, progressbar.OptionShowDescriptionAtLineEnd())
}

func newBar(w io.Writer, total int64, opts ...progressbar.Option) *Bar {
	if !IsTerminal(w) {
		return &Bar{}
	}
	return &Bar{pb: progressbar.NewOptions64(max(total, 1), append([]progressbar.Option{
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetWidth(30),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionSetPredictTime(false),
		progressbar.OptionShowElapsedTimeOnFinish(),
		progressbar.OptionThrottle(100 * time.Millisecond),
		progressbar.OptionSetTheme(progressbar.Theme{Saucer: "█", SaucerPadding: "░"}),
		progressbar.OptionOnCompletion(func() { _, _ = io.WriteString(w, "\n") }),
	}, opts...)...)}
}

// Set draws done steps.
func (b *Bar) Set(done int64) {
	if b == nil || b.pb == nil {
		return
	}
	_ = b.pb.Set64(done)
}

// SetTotal changes the number of steps (at least 1).
func (b *Bar) SetTotal(total int64) {
	if b == nil || b.pb == nil {
		return
	}
	b.pb.ChangeMax64(max(total, 1))
}

// Describe changes the text beside the bar.
func (b *Bar) Describe(s string) {
	if b == nil || b.pb == nil {
		return
	}
	b.pb.Describe(s)
}

// Finish draws done steps a last time and ends the line; the bar draws
// nothing after it.
func (b *Bar) Finish(done int64) {
	if b == nil || b.pb == nil {
		return
	}
	_ = b.pb.Set64(done)
	if !b.pb.IsFinished() {
		_ = b.pb.Exit() // ends the line (OnCompletion) without filling the bar
	}
}
