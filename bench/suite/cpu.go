package suite

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferrymq/ferry/internal/procstat"
	"github.com/ferrymq/ferry/internal/runcost"
)

// meter measures what end-to-end cost: runcost's full measurement (CPU,
// WAL bytes, commits) where it works, else the CPU alone from /proc (a
// server whose statistics views runcost cannot read; its note says why).
type meter struct {
	full  *runcost.Meter
	procs []runcost.Process
	cpu   []time.Duration
	start time.Time
	note  string // why only the CPU was measured
}

func startMeter(ctx context.Context, pool *pgxpool.Pool, procs []runcost.Process) (*meter, error) {
	m := &meter{procs: procs, start: time.Now()}
	full, err := runcost.Start(ctx, pool, procs...)
	if err == nil {
		m.full = full
		return m, nil
	}
	m.note = "WAL and commits not measured (" + err.Error() + ")"
	if m.cpu, err = treeCPU(procs); err != nil {
		return nil, err
	}
	return m, nil
}

func treeCPU(procs []runcost.Process) ([]time.Duration, error) {
	out := make([]time.Duration, len(procs))
	for i, p := range procs {
		d, err := procstat.TreeCPU(p.PID)
		if err != nil {
			return nil, fmt.Errorf("bench: CPU of %s (pid %d): %w", p.Name, p.PID, err)
		}
		out[i] = d
	}
	return out, nil
}

// stop returns the cost since start; without runcost only Elapsed and
// CPU are set.
func (m *meter) stop(ctx context.Context, pool *pgxpool.Pool) (runcost.Cost, error) {
	if m.full != nil {
		return m.full.Stop(ctx, pool)
	}
	c := runcost.Cost{Elapsed: time.Since(m.start)}
	end, err := treeCPU(m.procs)
	if err != nil {
		return c, err
	}
	for i, p := range m.procs {
		c.CPU = append(c.CPU, runcost.ProcessCPU{Name: p.Name, CPU: end[i] - m.cpu[i]})
	}
	return c, nil
}
