package suite

import (
	"fmt"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// barFigure is the figure each scenario's bar chart shows.
var barFigure = map[string]string{
	ScenarioRaw:      "publish",
	ScenarioEndToEnd: "throughput",
	ScenarioOrdering: "violations",
	ScenarioRouting:  "delivered",
	ScenarioRetry:    "median error",
	ScenarioReplay:   "replay",
	ScenarioPeer:     "p99",
}

// writeCharts draws one chart per scenario with figures to dir, as
// <scenario>.svg and <scenario>.png: the outbox lag over time for
// pipeline, the latency CDF for latency, bars of the scenario's main
// figure per broker and variant for the others. It returns the SVG file
// name per scenario.
func writeCharts(dir string, res *Results) (map[string]string, error) {
	out := map[string]string{}
	for _, sc := range Scenarios {
		var rows []Result
		for _, r := range res.Results {
			if r.Scenario == sc && r.Status == statusOK {
				rows = append(rows, r)
			}
		}
		if len(rows) == 0 {
			continue
		}
		var p *plot.Plot
		var err error
		switch sc {
		case ScenarioPipeline:
			p, err = lineChart(rows, "pipeline: outbox lag while the relay drains it", "seconds since start", "unpublished outbox rows")
		case ScenarioFaults:
			p, err = lineChart(rows, "faults: events handled while the broker restarts and relay and worker are killed", "seconds since start", "events handled")
		case ScenarioLatency:
			p, err = lineChart(rows, "latency: commit to handled, CDF", "milliseconds", "fraction of events")
		default:
			fig, ok := barFigure[sc]
			if !ok {
				continue
			}
			p, err = barChart(rows, sc, fig)
		}
		if err != nil {
			return nil, fmt.Errorf("bench: chart %s: %w", sc, err)
		}
		if p == nil {
			continue
		}
		for _, ext := range []string{".svg", ".png"} {
			if err := p.Save(9*vg.Inch, 4.5*vg.Inch, filepath.Join(dir, sc+ext)); err != nil {
				return nil, fmt.Errorf("bench: chart %s: %w", sc, err)
			}
		}
		out[sc] = sc + ".svg"
	}
	return out, nil
}

func label(r Result) string {
	if r.Variant == "" {
		return r.Broker
	}
	return r.Broker + " " + r.Variant
}

// lineChart draws each row's Series as a line.
func lineChart(rows []Result, title, x, y string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text, p.X.Label.Text, p.Y.Label.Text = title, x, y
	p.Legend.Top = true
	drawn := 0
	for i, r := range rows {
		if len(r.Series) == 0 {
			continue
		}
		xys := make(plotter.XYs, len(r.Series))
		for j, pt := range r.Series {
			xys[j].X, xys[j].Y = pt.X, pt.Y
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return nil, err
		}
		l.Color = plotutil.Color(i)
		l.Dashes = plotutil.Dashes(i)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(label(r), l)
		drawn++
	}
	if drawn == 0 {
		return nil, nil
	}
	p.Add(plotter.NewGrid())
	return p, nil
}

// barChart draws fig of each row as a bar.
func barChart(rows []Result, sc, fig string) (*plot.Plot, error) {
	var (
		vals   plotter.Values
		labels []string
		unit   string
	)
	for _, r := range rows {
		for _, f := range r.Figures {
			if f.Name == fig {
				vals = append(vals, f.Value)
				labels = append(labels, label(r))
				unit = f.Unit
			}
		}
	}
	if len(vals) == 0 {
		return nil, nil
	}
	p := plot.New()
	p.Title.Text = sc + ": " + fig
	p.Y.Label.Text = fig
	if unit != "" {
		p.Y.Label.Text += " (" + unit + ")"
	}
	bars, err := plotter.NewBarChart(vals, vg.Points(40))
	if err != nil {
		return nil, err
	}
	bars.Color = plotutil.Color(0)
	p.Add(bars)
	p.NominalX(labels...)
	p.Y.Min = 0
	return p, nil
}
