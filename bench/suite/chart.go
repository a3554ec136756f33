package suite

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Chart sizes: a panel is 6.5 × 4.5 in, a chart of one panel 9 in wide;
// the PNGs are drawn at 96 dpi (864 pixels for 9 in).
const (
	chartHeight = 4.5 * vg.Inch
	panelWidth  = 6.5 * vg.Inch
	chartWidth1 = 9 * vg.Inch
	chartDPI    = 96
)

// fellBehindMs is the median latency from which a broker counts as
// fallen behind at a rate: events wait in a backlog that grows instead
// of flowing through (SQS at 1,000/s: 17.5 s).
const fellBehindMs = 1000 // the caption says "above 1 s"

// barFigures are the figures each bar chart shows, in one panel per
// entry: a bar per broker and variant (and figure, when a panel has
// several).
var barFigures = map[string][]panelSpec{
	ScenarioRaw:      {{title: "raw client, every batch confirmed", figures: []string{"publish", "consume"}, y: "msgs/s"}},
	ScenarioEndToEnd: {{title: "throughput, 4 producers flat out", figures: []string{"throughput"}, y: "throughput (events/s)"}, {title: "CPU per 1,000 events, by process", figures: []string{"CPU ferry", "CPU postgres", "CPU broker"}, y: "CPU-s per 1,000 events"}},
	ScenarioOrdering: {{title: "per-key order violations of 5,000 events over 4 keys", figures: []string{"violations"}, y: "events out of key order"}},
	ScenarioRouting:  {{title: "publish to the 7 bound queues", figures: []string{"publish"}, y: "msgs/s"}},
	ScenarioRetry:    {{title: "a retry asked for after 1 s: how late it came", figures: []string{"median error", "max error"}, y: "delay error (ms)"}},
	ScenarioReplay:   {{title: "re-reading every acked message from the start", figures: []string{"replay"}, y: "msgs/s"}},
}

// panelSpec is one bar panel: its title, the figures it shows and the
// Y axis label (with the unit).
type panelSpec struct {
	title   string
	figures []string
	y       string
}

// chart is what one chart file shows: panels side by side and a caption
// under them.
type chart struct {
	panels  []*plot.Plot
	caption []string
	// legend, when set, is drawn right of the panels, for all of them.
	legend *plot.Legend
	// panelWidth, when set, is each panel's width (default panelWidth,
	// or chartWidth1 for a chart of one panel).
	panelWidth vg.Length
}

// legendWidth is the strip right of the panels for a chart's own legend.
const legendWidth = 1.7 * vg.Inch

// writeCharts draws one chart per scenario with figures to dir, as
// <scenario>.svg and <scenario>.png, each with a caption naming the
// machine and its load: the outbox lag over time (pipeline), the events
// handled over time (faults), the latency CDF on a log scale, one panel
// per rate (latency), ferry ÷ Watermill per broker (peer), the backlog
// around the leader's kill and the recovery times (failover), bars of the
// scenario's main figures per broker and variant (the others); the peer
// scenario has a second chart, PeerCPUChart. It returns the SVG file name
// per scenario (and PeerCPUChart's under that name).
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
		charts := map[string]func() (*chart, error){sc: func() (*chart, error) { return scenarioChart(sc, rows) }}
		if sc == ScenarioPeer {
			charts[PeerCPUChart] = func() (*chart, error) { return peerCPUChart(rows) }
		}
		for name, draw := range charts {
			ch, err := draw()
			if err != nil {
				return nil, fmt.Errorf("bench: chart %s: %w", name, err)
			}
			if ch == nil {
				continue
			}
			ch.caption = append(ch.caption, machineCaption(res, rows))
			for _, ext := range []string{".svg", ".png"} {
				if err := ch.save(filepath.Join(dir, name+ext)); err != nil {
					return nil, fmt.Errorf("bench: chart %s: %w", name, err)
				}
			}
			out[name] = name + ".svg"
		}
	}
	return out, nil
}

// scenarioChart is the chart of scenario sc drawn from its rows (see
// writeCharts), nil for a scenario without one.
func scenarioChart(sc string, rows []Result) (*chart, error) {
	switch sc {
	case ScenarioPipeline:
		return lineChart(rows, "pipeline: outbox lag while the relay drains a prefilled outbox", "time since the start (s)", "unpublished outbox rows (events)")
	case ScenarioFaults:
		return lineChart(rows, "faults: events handled while the broker restarts, then the relay and the worker are killed", "time since the start (s)", "events handled (count)")
	case ScenarioLatency:
		return latencyChart(rows)
	case ScenarioPeer:
		return peerChart(rows)
	case ScenarioFailover:
		return failoverChart(rows)
	}
	if specs, ok := barFigures[sc]; ok {
		return barChart(rows, sc, specs)
	}
	return nil, nil
}

// machineCaption says where and under what load rows were measured: the
// cores, the CPU, the 1-minute load average at the start of the run and
// at the end of each charted run, and when.
func machineCaption(res *Results, rows []Result) string {
	h := res.Host
	s := fmt.Sprintf("Measured on %d cores (%s), %.1f GiB; load average %s at the start of the run", h.Cores, h.CPU, float64(h.MemoryBytes)/(1<<30), h.LoadAverage)
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range rows {
		if r.LoadAverage > 0 {
			lo, hi = min(lo, r.LoadAverage), max(hi, r.LoadAverage)
		}
	}
	switch {
	case hi < 0:
	case lo == hi:
		s += fmt.Sprintf(", %.2f at the end of this scenario", hi)
	default:
		s += fmt.Sprintf(", %.2f to %.2f at the ends of this scenario's runs", lo, hi)
	}
	s += " (1-minute averages"
	if h.Cores > 0 {
		s += fmt.Sprintf("; %d = every core busy", h.Cores)
	}
	s += ")"
	if !res.Started.IsZero() {
		s += "; " + res.Started.Format("2006-01-02 15:04 UTC")
	}
	return s + "."
}

// save draws c's panels side by side above its caption and writes them to
// path, as SVG or PNG after its extension.
func (c *chart) save(path string) error {
	w := chartWidth1
	switch {
	case c.panelWidth > 0:
		w = c.panelWidth * vg.Length(len(c.panels))
	case len(c.panels) > 1:
		w = panelWidth * vg.Length(len(c.panels))
	}
	if c.legend != nil {
		w += legendWidth
	}
	lineH := vg.Points(11)
	// About 2 characters per 9 points of width at the caption's 9 points.
	var caption []string
	for _, l := range c.caption {
		caption = append(caption, wrap(l, int(w/vg.Points(4.4)))...)
	}
	h := chartHeight + lineH*vg.Length(len(caption)) + vg.Points(8)
	var (
		canvas vg.CanvasWriterTo
		dc     draw.Canvas
	)
	switch filepath.Ext(path) {
	case ".svg":
		sc := vgsvg.New(w, h)
		canvas, dc = sc, draw.New(sc)
	case ".png":
		ic := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(chartDPI), vgimg.UseBackgroundColor(color.White))
		canvas, dc = vgimg.PngCanvas{Canvas: ic}, draw.New(ic)
	default:
		return fmt.Errorf("chart %s: want .svg or .png", path)
	}
	plots := dc
	plots.Min.Y += h - chartHeight
	if c.legend != nil {
		plots.Max.X -= legendWidth
		lc := plots
		lc.Min.X, lc.Max.X = plots.Max.X+vg.Points(8), dc.Max.X
		lc.Max.Y -= vg.Points(30)
		c.legend.Top, c.legend.Left = true, true
		c.legend.Draw(lc)
	}
	tiles := draw.Tiles{Rows: 1, Cols: len(c.panels), PadX: vg.Points(24), PadTop: vg.Points(4), PadLeft: vg.Points(4), PadRight: vg.Points(8)}
	for i, p := range c.panels {
		p.Draw(tiles.At(plots, i, 0))
	}
	sty := captionStyle()
	for i, l := range caption {
		dc.FillText(sty, vg.Point{X: dc.Min.X + vg.Points(6), Y: dc.Min.Y + h - chartHeight - vg.Points(4) - lineH*vg.Length(i+1)}, l)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = canvas.WriteTo(f)
	return errors.Join(err, f.Close())
}

// wrap breaks s into lines of at most width characters at spaces (a
// longer word gets a line of its own).
func wrap(s string, width int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		if line != "" && len([]rune(line))+1+len([]rune(w)) > width {
			lines = append(lines, line)
			line = ""
		}
		line = strings.TrimSpace(line + " " + w)
	}
	return append(lines, line)
}

func captionStyle() text.Style {
	sty := plot.New().X.Label.TextStyle
	sty.Font.Size = vg.Points(9)
	sty.XAlign, sty.YAlign = draw.XLeft, draw.YBottom
	return sty
}

// newPanel returns a plot with the title and axis labels, value ticks
// without trailing zeros and a grid.
func newPanel(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text, p.X.Label.Text, p.Y.Label.Text = title, x, y
	p.Title.TextStyle.Font.Size = vg.Points(11)
	// A rotated Y label longer than about half the panel's height makes
	// gonum shrink the panel: keep them short.
	p.X.Label.TextStyle.Font.Size, p.Y.Label.TextStyle.Font.Size = vg.Points(10.5), vg.Points(10.5)
	p.X.Tick.Marker, p.Y.Tick.Marker = plainTicks{}, plainTicks{}
	p.Legend.Top = true
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	return p
}

func label(r Result) string {
	if r.Variant == "" {
		return r.Broker
	}
	return r.Broker + " " + r.Variant
}

// lineChart draws each row's Series as a line, in one panel.
func lineChart(rows []Result, title, x, y string) (*chart, error) {
	p := newPanel(title, x, y)
	drawn := 0
	for i, r := range rows {
		if len(r.Series) == 0 {
			continue
		}
		l, err := seriesLine(r.Series, i, 0)
		if err != nil {
			return nil, err
		}
		p.Add(l)
		p.Legend.Add(label(r), l)
		drawn++
	}
	if drawn == 0 {
		return nil, nil
	}
	p.Add(plotter.NewGrid())
	return &chart{panels: []*plot.Plot{p}}, nil
}

// seriesLine is series as the i-th line of a panel, X values below minX
// raised to it (a log axis starts above 0).
func seriesLine(series []Point, i int, minX float64) (*plotter.Line, error) {
	xys := make(plotter.XYs, len(series))
	for j, pt := range series {
		xys[j].X, xys[j].Y = max(pt.X, minX), pt.Y
	}
	l, err := plotter.NewLine(xys)
	if err != nil {
		return nil, err
	}
	l.Color = plotutil.Color(i)
	l.Dashes = plotutil.Dashes(i)
	l.Width = vg.Points(1.5)
	return l, nil
}

// latencyChart draws the commit-to-handled latency CDF, one panel per
// rate (variant), on a logarithmic time axis: a broker that falls behind
// (median above fellBehindMs) sits decades to the right instead of
// squeezing the others into the first pixel, and its legend says so.
func latencyChart(rows []Result) (*chart, error) {
	var variants []string
	lo, hi := math.Inf(1), 0.0
	for _, r := range rows {
		if !slices.Contains(variants, r.Variant) {
			variants = append(variants, r.Variant)
		}
		for _, pt := range r.Series {
			// The axis starts at the fastest broker's first percentile: a
			// stray faster event would stretch it by a decade of nothing.
			if pt.X > 0 && pt.Y >= 0.01 {
				lo = min(lo, pt.X)
			}
			hi = max(hi, pt.X)
		}
	}
	if hi == 0 || math.IsInf(lo, 1) {
		return nil, nil
	}
	// From a whole decade to 1, 2 or 5 times one, the same on every panel
	// so that they compare.
	lo = math.Pow10(int(math.Floor(math.Log10(lo))))
	hi = roundUp125(hi)
	if hi <= lo {
		hi = lo * 10
	}
	brokers := brokersOf(rows)
	leg := plot.NewLegend()
	leg.TextStyle.Font.Size = vg.Points(10)
	ch := &chart{legend: &leg}
	var behind, legended []string
	for _, v := range variants {
		title := "latency at " + v
		if v == "" {
			title = "latency"
		}
		p := newPanel(title+": commit to handled, CDF", "latency from commit to handled (ms, log scale)", "events handled within x (%)")
		p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, msLogTicks{}
		p.X.Min, p.X.Max = lo, hi
		p.Y.Min, p.Y.Max = 0, 100
		p.Y.Tick.Marker = percentTicks{}
		for _, r := range rows {
			if r.Variant != v || len(r.Series) == 0 {
				continue
			}
			pct := make([]Point, len(r.Series))
			for i, pt := range r.Series {
				pct[i] = Point{X: pt.X, Y: 100 * pt.Y}
			}
			l, err := seriesLine(pct, slices.Index(brokers, r.Broker), lo)
			if err != nil {
				return nil, err
			}
			p.Add(l)
			if p50, ok := r.figure("p50"); ok && p50 >= fellBehindMs {
				behind = append(behind, fmt.Sprintf("%s at %s (median %s)", r.Broker, v, FormatSeconds(p50/1000)))
			}
			if !slices.Contains(legended, r.Broker) {
				legended = append(legended, r.Broker)
				leg.Add(r.Broker, l)
			}
		}
		p.Add(plotter.NewGrid())
		ch.panels = append(ch.panels, p)
	}
	note := "Each decade of the time axis is 10 times the one before. A curve further right is slower; a steep curve is a steady one."
	if len(behind) > 0 {
		note += " Fell behind (median wait above 1 s, a growing backlog): " + strings.Join(behind, ", ") + "."
	}
	ch.caption = []string{note}
	return ch, nil
}

// brokersOf returns the brokers of rows in order of first appearance:
// a broker keeps its colour across panels.
func brokersOf(rows []Result) []string {
	var out []string
	for _, r := range rows {
		if !slices.Contains(out, r.Broker) {
			out = append(out, r.Broker)
		}
	}
	return out
}

// barSeries is one coloured set of bars: a value per broker (NaN: none).
type barSeries struct {
	name   string
	values []float64
}

// groupedBars draws series as groups of bars, one group per broker (the X
// axis), each bar labelled with its value; NaN values are left out and
// negative ones are labelled never (a recovery that never came).
func groupedBars(p *plot.Plot, brokers []string, series []barSeries) error {
	if len(series) == 0 {
		return nil
	}
	width := vg.Points(math.Min(60, 300/float64(len(series)*len(brokers))+8))
	top := 0.0
	for _, s := range series {
		for _, v := range s.values {
			if !math.IsNaN(v) {
				top = max(top, v)
			}
		}
	}
	for i, s := range series {
		vals := make(plotter.Values, len(brokers))
		var (
			xys    plotter.XYs
			labels []string
		)
		for j, v := range s.values {
			switch {
			case math.IsNaN(v):
				continue
			case v < 0:
				xys = append(xys, plotter.XY{X: float64(j), Y: 0})
				labels = append(labels, "never")
			default:
				vals[j] = v
				xys = append(xys, plotter.XY{X: float64(j), Y: v})
				labels = append(labels, shortValue(v))
			}
		}
		b, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return err
		}
		b.Color = plotutil.Color(i)
		b.LineStyle.Width = 0
		b.Offset = width * vg.Length(float64(i)-float64(len(series)-1)/2)
		p.Add(b)
		if len(series) > 1 {
			p.Legend.Add(s.name, b)
		}
		if len(xys) > 0 {
			lb, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: labels})
			if err != nil {
				return err
			}
			for k := range lb.TextStyle {
				lb.TextStyle[k].Font.Size = vg.Points(7.5)
				lb.TextStyle[k].XAlign = draw.XCenter
			}
			lb.Offset = vg.Point{X: b.Offset, Y: vg.Points(2)}
			p.Add(lb)
		}
	}
	p.NominalX(brokers...)
	p.Y.Min = 0
	// Room above the tallest bar for its label and the legend.
	p.Y.Max = top * (1.12 + 0.07*float64(len(series)))
	if top == 0 {
		p.Y.Max = 1
	}
	return nil
}

// barChart draws the panels of specs: per broker, a bar per variant and
// figure.
func barChart(rows []Result, sc string, specs []panelSpec) (*chart, error) {
	brokers := brokersOf(rows)
	ch := &chart{}
	// Where some rows have a variant, the rows without one are named by
	// their relay ("poll relay"), not left without a legend.
	named := slices.ContainsFunc(rows, func(r Result) bool { return r.Variant != "" })
	for _, spec := range specs {
		var series []barSeries
		for _, fig := range spec.figures {
			for _, r := range rows {
				if _, ok := r.figure(fig); !ok {
					continue
				}
				name := r.Variant
				if name == "" && named && r.RelayMode != "" {
					name = r.RelayMode + " relay"
				}
				if len(spec.figures) > 1 {
					name = strings.TrimSpace(fig + " " + name)
				}
				i := slices.IndexFunc(series, func(s barSeries) bool { return s.name == name })
				if i < 0 {
					series = append(series, barSeries{name: name, values: nanValues(len(brokers))})
					i = len(series) - 1
				}
				series[i].values[slices.Index(brokers, r.Broker)], _ = r.figure(fig)
			}
		}
		if len(series) == 0 {
			continue
		}
		p := newPanel(sc+": "+spec.title, "", spec.y)
		if err := groupedBars(p, brokers, series); err != nil {
			return nil, err
		}
		ch.panels = append(ch.panels, p)
	}
	if len(ch.panels) == 0 {
		return nil, nil
	}
	return ch, nil
}

func nanValues(n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = math.NaN()
	}
	return v
}

// peerRatioPrefix starts the name of every ferry ÷ Watermill figure of
// the peer scenario ("ferry/watermill throughput", "ferry/watermill p99").
const peerRatioPrefix = "ferry/watermill "

// peerChart draws ferry ÷ Watermill, one panel per ratio figure of the
// peer scenario (peerRatioPrefix), on a log scale around parity (1): a
// group of dots per Watermill variant (its settings, a rate), a dot per
// broker, whatever brokers the peer ran on.
func peerChart(rows []Result) (*chart, error) {
	var figs []string
	for _, r := range rows {
		for _, f := range r.Figures {
			if strings.HasPrefix(f.Name, peerRatioPrefix) && !slices.Contains(figs, f.Name) {
				figs = append(figs, f.Name)
			}
		}
	}
	if len(figs) == 0 {
		return nil, nil
	}
	brokers := brokersOf(rows)
	leg := plot.NewLegend()
	leg.TextStyle.Font.Size = vg.Points(10)
	ch := &chart{legend: &leg}
	legended := map[string]bool{}
	for _, fig := range figs {
		what := strings.TrimPrefix(fig, peerRatioPrefix)
		better := "lower is better for ferry"
		if what == "throughput" {
			better = "higher is better for ferry"
		}
		p := newPanel("ferry's "+what+" ÷ Watermill's ("+better+")", "ferry's relay ÷ Watermill's settings (and rate)", "ratio (log scale)")
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, ratioLogTicks{}
		var variants []string
		lo, hi := 1.0, 1.0
		for _, r := range rows {
			if v, ok := r.figure(fig); ok && v > 0 {
				if !slices.Contains(variants, r.Variant) {
					variants = append(variants, r.Variant)
				}
				lo, hi = min(lo, v), max(hi, v)
			}
		}
		step := 0.8 / float64(max(len(brokers), 1))
		for bi, br := range brokers {
			var (
				xys    plotter.XYs
				labels []string
			)
			for _, r := range rows {
				if v, ok := r.figure(fig); ok && v > 0 && r.Broker == br {
					x := float64(slices.Index(variants, r.Variant)) + step*(float64(bi)-float64(len(brokers)-1)/2)
					xys = append(xys, plotter.XY{X: x, Y: v})
					labels = append(labels, shortValue(v))
				}
			}
			if len(xys) == 0 {
				continue
			}
			s, err := plotter.NewScatter(xys)
			if err != nil {
				return nil, err
			}
			s.GlyphStyle.Color = plotutil.Color(bi)
			s.GlyphStyle.Shape = plotutil.Shape(bi)
			s.GlyphStyle.Radius = vg.Points(4)
			p.Add(s)
			if !legended[br] {
				legended[br] = true
				leg.Add(br, s)
			}
			lb, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: labels})
			if err != nil {
				return nil, err
			}
			for k := range lb.TextStyle {
				lb.TextStyle[k].Font.Size = vg.Points(7.5)
				lb.TextStyle[k].XAlign = draw.XCenter
			}
			lb.Offset = vg.Point{Y: vg.Points(6)}
			p.Add(lb)
		}
		parity := plotter.NewFunction(func(float64) float64 { return 1 })
		parity.Color = color.Gray{Y: 90}
		parity.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(parity)
		if !legended["parity"] {
			legended["parity"] = true
			leg.Add("parity: as fast", parity)
		}
		p.Add(plotter.NewGrid())
		names := make([]string, len(variants))
		for i, v := range variants {
			names[i] = peerRatioLabel(v)
		}
		p.NominalX(names...)
		p.X.Min, p.X.Max = -0.6, float64(len(variants))-0.4
		p.Y.Min = math.Pow10(int(math.Floor(math.Log10(lo) + 1e-9)))
		p.Y.Max = roundUp125(hi * 1.5) // room for the top label
		ch.panels = append(ch.panels, p)
	}
	ch.caption = []string{"Ratios within one run: ferry's own end-to-end and latency results divided by the Watermill peer's (bench/watermill) on the same PostgreSQL and broker, with the same events and rates."}
	return ch, nil
}

// PeerCPUChart is the name (without extension) of the peer scenario's
// second chart: per broker, stacked bars of CPU per 1,000 events split
// into the pipeline's own process, PostgreSQL and the broker, for ferry
// with the polling relay, ferry with the WAL relay and batched commits
// and Watermill tuned.
const PeerCPUChart = "peer-cpu"

// peerCPUPipelines are the bars of PeerCPUChart: the peer's end-to-end
// row of each pipeline and its label under the bar.
var peerCPUPipelines = []struct{ variant, label string }{
	{PeerFerryEndToEnd, "ferry\npoll relay"},
	{PeerFerryWALEndToEnd, "ferry WAL relay\n+ batched commits"},
	{"watermill tuned, end-to-end", "Watermill\ntuned"},
}

// peerCPUParts are the stacked parts of a PeerCPUChart bar: the peer
// rows' figure and its legend.
var peerCPUParts = []struct{ figure, legend string }{
	{"CPU app", "own process"},
	{"CPU postgres", "PostgreSQL"},
	{"CPU broker", "broker"},
}

// cpuBar is one bar of PeerCPUChart: its label and its parts' values
// (peerCPUParts' order, s per 1,000 events; 0 for a part missing).
type cpuBar struct {
	label string
	parts []float64
}

// total is the bar's height.
func (b cpuBar) total() float64 {
	sum := 0.0
	for _, v := range b.parts {
		sum += v
	}
	return sum
}

// peerCPUBars returns the bars of PeerCPUChart per broker found in rows
// (brokers, in rows' order, only those with at least one bar) and the
// tallest bar's height.
func peerCPUBars(rows []Result) (brokers []string, bars map[string][]cpuBar, top float64) {
	bars = map[string][]cpuBar{}
	for _, br := range brokersOf(rows) {
		for _, pl := range peerCPUPipelines {
			i := slices.IndexFunc(rows, func(r Result) bool { return r.Broker == br && r.Variant == pl.variant })
			if i < 0 {
				continue
			}
			b := cpuBar{label: pl.label}
			found := false
			for _, part := range peerCPUParts {
				v, ok := rows[i].figure(part.figure)
				found = found || ok
				b.parts = append(b.parts, v)
			}
			if !found {
				continue
			}
			top = max(top, b.total())
			bars[br] = append(bars[br], b)
		}
		if len(bars[br]) > 0 {
			brokers = append(brokers, br)
		}
	}
	return brokers, bars, top
}

// peerCPUChart draws PeerCPUChart from the peer scenario's rows: a panel
// per broker with the same Y axis, a stacked bar per pipeline of
// peerCPUPipelines found (peerCPUBars), labelled with its total. Nil
// when no broker has any.
func peerCPUChart(rows []Result) (*chart, error) {
	brokers, perBroker, top := peerCPUBars(rows)
	if len(brokers) == 0 {
		return nil, nil
	}
	leg := plot.NewLegend()
	leg.TextStyle.Font.Size = vg.Points(10)
	ch := &chart{legend: &leg, panelWidth: 4.2 * vg.Inch}
	for bi, br := range brokers {
		bars := perBroker[br]
		p := newPanel(br+": CPU per 1,000 events", "", "CPU-s per 1,000 events")
		var below *plotter.BarChart
		stacked := make([]*plotter.BarChart, len(peerCPUParts))
		for k := range peerCPUParts {
			vals := make(plotter.Values, len(bars))
			for j, b := range bars {
				vals[j] = b.parts[k]
			}
			bc, err := plotter.NewBarChart(vals, vg.Points(46))
			if err != nil {
				return nil, err
			}
			bc.Color = plotutil.Color(k)
			bc.LineStyle.Width = 0
			if below != nil {
				bc.StackOn(below)
			}
			below, stacked[k] = bc, bc
			p.Add(bc)
		}
		// The legend lists the parts top down, as they are stacked.
		for k := len(peerCPUParts) - 1; k >= 0 && bi == 0; k-- {
			leg.Add(peerCPUParts[k].legend, stacked[k])
		}
		var (
			xys    plotter.XYs
			labels []string
			names  []string
		)
		for j, b := range bars {
			xys = append(xys, plotter.XY{X: float64(j), Y: b.total()})
			labels = append(labels, shortValue(b.total()))
			names = append(names, b.label)
		}
		lb, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: labels})
		if err != nil {
			return nil, err
		}
		for k := range lb.TextStyle {
			lb.TextStyle[k].Font.Size = vg.Points(8.5)
			lb.TextStyle[k].XAlign = draw.XCenter
		}
		lb.Offset = vg.Point{Y: vg.Points(3)}
		p.Add(lb)
		p.NominalX(names...)
		p.X.Tick.Label.Font.Size = vg.Points(8.5)
		p.Y.Min, p.Y.Max = 0, top*1.15
		if top == 0 {
			p.Y.Max = 1
		}
		ch.panels = append(ch.panels, p)
	}
	ch.caption = []string{"Where an event's CPU goes, end to end (producers commit a business row and its event; relay or forwarder; worker): CPU seconds per 1,000 events of the pipeline's own process (producers, relay or forwarder, worker or consumers), of the PostgreSQL server (every backend, the whole server: other work on it lands here too) and of the broker's server, measured from the first commit to the last event handled; bars labelled with their total. One run of each pipeline, one after the other, on the same servers."}
	return ch, nil
}

// peerRatioLabel is the X label of a peer ratio row's variant v in
// two short lines: "poll relay" for PeerRatio's rows, "WAL + batched" for
// PeerWALRatio's, then "÷ <profile>".
func peerRatioLabel(v string) string {
	v = strings.TrimSuffix(v, ", end-to-end")
	switch {
	case strings.HasPrefix(v, PeerWALRatio):
		return "WAL + batched\n÷ " + strings.TrimPrefix(v, PeerWALRatio)
	case strings.HasPrefix(v, PeerRatio):
		return "poll relay\n÷ " + strings.TrimPrefix(v, PeerRatio)
	}
	return v
}

// failoverFigures are the recovery times the failover chart's bars show.
var failoverFigures = []string{"publish resumed", "handling resumed", "backlog drained"}

// failoverChart draws the backlog (committed minus handled) around the
// kill of the leader, per broker, and the recovery times as bars.
func failoverChart(rows []Result) (*chart, error) {
	brokers := brokersOf(rows)
	lag := newPanel("failover: backlog around the kill of the leader", "time since the leader was killed with SIGKILL (s)", "backlog (events committed − handled)")
	for _, r := range rows {
		if len(r.Series) == 0 {
			continue
		}
		l, err := seriesLine(r.Series, slices.Index(brokers, r.Broker), math.Inf(-1))
		if err != nil {
			return nil, err
		}
		lag.Add(l)
		lag.Legend.Add(r.Broker, l)
	}
	kill, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 0}, {X: 0, Y: maxSeriesY(rows)}})
	if err != nil {
		return nil, err
	}
	kill.Color = color.Gray{Y: 90}
	kill.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	lag.Add(kill, plotter.NewGrid())
	lag.Legend.Add("kill", kill)
	times := newPanel("failover: time from the kill until…", "", "seconds after the kill (s)")
	var series []barSeries
	for _, fig := range failoverFigures {
		s := barSeries{name: fig, values: nanValues(len(brokers))}
		for _, r := range rows {
			if v, ok := r.figure(fig); ok {
				s.values[slices.Index(brokers, r.Broker)] = v
			}
		}
		series = append(series, s)
	}
	if err := groupedBars(times, brokers, series); err != nil {
		return nil, err
	}
	ch := &chart{panels: []*plot.Plot{lag, times}}
	var notes []string
	for _, r := range rows {
		lost, _ := r.figure("lost")
		twice, _ := r.figure("effects applied twice")
		procs, _ := r.figure("cluster processes")
		mem, _ := r.figure("cluster memory")
		notes = append(notes, fmt.Sprintf("%s: %.0f lost, %.0f applied twice, %.0f processes, %.0f MiB", r.Broker, lost, twice, procs, mem))
	}
	ch.caption = []string{"Three nodes per broker at 200 events/s; the killed node is started again once the pipeline caught up. " + strings.Join(notes, "; ") + "."}
	return ch, nil
}

func maxSeriesY(rows []Result) float64 {
	m := 1.0
	for _, r := range rows {
		for _, pt := range r.Series {
			m = max(m, pt.Y)
		}
	}
	return m
}

// plainTicks label a linear axis every 1, 2 or 5 times a power of ten,
// 4 to 10 labels, with 4 or 1 minor ticks between them, labelled without
// trailing zeros and with thousands grouped ("5,000", not "5000.00").
type plainTicks struct{}

func (plainTicks) Ticks(lo, hi float64) []plot.Tick {
	if !(hi > lo) || math.IsInf(hi-lo, 0) {
		return nil
	}
	step := roundUp125((hi - lo) / 8)
	minor := step / 5
	if m := step / math.Pow10(int(math.Floor(math.Log10(step)+1e-9))); math.Abs(m-2) < 1e-9 {
		minor = step / 2
	}
	var ticks []plot.Tick
	for i := math.Ceil(lo/minor - 1e-9); i*minor <= hi*(1+1e-12)+1e-12; i++ {
		v := i * minor
		t := plot.Tick{Value: v}
		if k := v / step; math.Abs(k-math.Round(k)) < 1e-6 {
			t.Value = math.Round(k) * step // no 0.30000000000000004
			t.Label = shortValue(t.Value)
		}
		ticks = append(ticks, t)
	}
	return ticks
}

// msLogTicks label a logarithmic axis of milliseconds at each decade:
// "0.1 ms", "1 ms", "10 ms", "100 ms", "1 s", "10 s".
type msLogTicks struct{}

func (msLogTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := logTicks(lo, hi)
	for i := range ticks {
		v := ticks[i].Value
		if !isDecade(v) {
			continue
		}
		if v >= 1000 {
			ticks[i].Label = strconv.FormatFloat(v/1000, 'f', -1, 64) + " s"
		} else {
			ticks[i].Label = strconv.FormatFloat(v, 'f', -1, 64) + " ms"
		}
	}
	return ticks
}

// logTicks returns unlabelled ticks at 1..9 times each power of ten from
// lo's decade to hi (lo > 0), exact decimal values: 0.1 is 1e-1, not
// 0.09999. (gonum's LogTicks starts a decade late when log10(lo) rounds
// to just above a whole number, as log10(0.1) does.)
func logTicks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	if lo <= 0 || hi <= lo {
		return nil
	}
	for e := int(math.Floor(math.Log10(lo) + 1e-9)); e <= int(math.Ceil(math.Log10(hi)-1e-9)); e++ {
		for m := 1; m <= 9; m++ {
			v, _ := strconv.ParseFloat(strconv.Itoa(m)+"e"+strconv.Itoa(e), 64)
			if v >= lo*(1-1e-9) && v <= hi*(1+1e-9) {
				ticks = append(ticks, plot.Tick{Value: v})
			}
		}
	}
	return ticks
}

// isDecade reports whether v is a power of ten.
func isDecade(v float64) bool {
	e := math.Round(math.Log10(v))
	return math.Abs(v-math.Pow10(int(e))) < 1e-9*v
}

// roundUp125 returns the smallest of 1, 2 or 5 times a power of ten that
// is at least v (v > 0).
func roundUp125(v float64) float64 {
	d := math.Pow10(int(math.Floor(math.Log10(v))))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*d >= v*(1-1e-9) {
			return m * d
		}
	}
	return 10 * d
}

// percentTicks label a 0-100 % axis at 0, 25, 50, 75, 90 and 100, the
// percentiles a reader looks for, with a minor tick every 5 and at 99.
type percentTicks struct{}

func (percentTicks) Ticks(float64, float64) []plot.Tick {
	var ticks []plot.Tick
	for v := 0; v <= 100; v += 5 {
		t := plot.Tick{Value: float64(v)}
		if v%25 == 0 || v == 90 {
			t.Label = strconv.Itoa(v)
		}
		ticks = append(ticks, t)
	}
	return append(ticks, plot.Tick{Value: 99})
}

// ratioLogTicks label a logarithmic ratio axis at each decade and at 2
// and 5 times it: "0.01", "0.02", "0.05", "0.1", … "1", "2", "5".
type ratioLogTicks struct{}

func (ratioLogTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := logTicks(lo, hi)
	for i := range ticks {
		v := ticks[i].Value
		m := v / math.Pow10(int(math.Floor(math.Log10(v)+1e-9)))
		if math.Abs(m-1) < 1e-6 || math.Abs(m-2) < 1e-6 || math.Abs(m-5) < 1e-6 {
			ticks[i].Label = strconv.FormatFloat(v, 'f', -1, 64)
		}
	}
	return ticks
}

// shortValue prints a value for a chart: thousands grouped for whole
// numbers from 1,000 on ("100,895"), else formatValue's precision.
func shortValue(v float64) string {
	if v == 0 {
		v = 0 // not "-0"
	}
	if math.Abs(v) >= 1000 {
		s := strconv.FormatFloat(math.Round(math.Abs(v)), 'f', 0, 64)
		for i := len(s) - 3; i > 0; i -= 3 {
			s = s[:i] + "," + s[i:]
		}
		if v < 0 {
			s = "-" + s
		}
		return s
	}
	return formatValue(v)
}
