package suite

import "github.com/ferrymq/ferry/internal/progress"

// bar draws the progress of one scenario run on a terminal (package
// internal/progress); on anything else, such as CI's log, it draws
// nothing: the "ferry bench: …" lines before and after each run say what
// ran and what it measured.
type bar struct {
	pb *progress.Bar
}

func (r *runner) newBar(label string, total int) *bar {
	return &bar{pb: progress.New(r.cfg.Progress, label, int64(total))}
}

// update draws done.
func (b *bar) update(done int64) { b.pb.Set(done) }

// setTotal changes the number of steps, for a run that learns its total
// as it goes.
func (b *bar) setTotal(total int64) { b.pb.SetTotal(total) }

// finish draws done a last time and ends the line.
func (b *bar) finish(done int64) { b.pb.Finish(done) }
