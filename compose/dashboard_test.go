package compose

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/metrics"
)

// dashboardFile is the Grafana dashboard provisioned by the observability
// profile.
var dashboardFile = filepath.Join("grafana", "dashboards", "ferry.json")

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID         int            `json:"id"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Datasource *datasourceRef `json:"datasource"`
	Targets    []struct {
		RefID      string         `json:"refId"`
		Expr       string         `json:"expr"`
		Datasource *datasourceRef `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // rows may hold their panels
}

type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string         `json:"name"`
			Type       string         `json:"type"`
			Datasource *datasourceRef `json:"datasource"`
			Definition string         `json:"definition"`
			AllValue   string         `json:"allValue"`
		} `json:"list"`
	} `json:"templating"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	var d dashboard
	require.NoError(t, json.Unmarshal(data, &d), "%s is not JSON", dashboardFile)
	return d
}

// all returns every panel, those inside rows included.
func (d dashboard) all() []panel {
	var out []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// datasourceUIDs lists the data source of every panel, target and variable.
func (d dashboard) datasourceUIDs() []string {
	var out []string
	add := func(r *datasourceRef) {
		if r != nil {
			out = append(out, r.UID)
		}
	}
	for _, p := range d.all() {
		add(p.Datasource)
		for _, tg := range p.Targets {
			add(tg.Datasource)
		}
	}
	for _, v := range d.Templating.List {
		add(v.Datasource)
	}
	return out
}

// exported returns the series ferry exports, by name, with their label
// names, read from a registry built like ferry's (metrics.NewRegistry,
// metrics.New and the outbox collector): a histogram family gives its
// _bucket (with le), _sum and _count series.
func exported(t *testing.T) map[string][]string {
	t.Helper()
	reg := metrics.NewRegistry()
	m, err := metrics.New(reg, "test")
	require.NoError(t, err)
	m.ObserveBatch(1, 1, time.Millisecond)
	require.NoError(t, metrics.RegisterOutbox(reg, "test", func(context.Context) (int, time.Duration, error) { return 1, time.Second, nil }))
	families, err := reg.Gather()
	require.NoError(t, err)
	out := map[string][]string{}
	for _, f := range families {
		var labels []string
		if len(f.GetMetric()) > 0 {
			for _, l := range f.GetMetric()[0].GetLabel() {
				labels = append(labels, l.GetName())
			}
		}
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM:
			out[f.GetName()+"_bucket"] = append(slices.Clone(labels), "le")
			out[f.GetName()+"_sum"] = labels
			out[f.GetName()+"_count"] = labels
		default:
			out[f.GetName()] = labels
		}
	}
	return out
}

// grafanaVar matches Grafana's variable syntaxes $name, ${name} and
// ${name:format}.
var grafanaVar = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)`)

// promQL replaces the dashboard's variables in expr by values Prometheus
// parses: Grafana's interval variables by a duration, a dashboard variable
// by its "All" value. An unknown variable is an error.
func promQL(d dashboard, expr string) (string, error) {
	var err error
	out := grafanaVar.ReplaceAllStringFunc(expr, func(m string) string {
		sub := grafanaVar.FindStringSubmatch(m)
		name := sub[1] + sub[2]
		switch name {
		case "__rate_interval", "__interval", "__range":
			return "5m"
		}
		for _, v := range d.Templating.List {
			if v.Name == name {
				return v.AllValue
			}
		}
		err = fmt.Errorf("unknown variable $%s", name)
		return m
	})
	return out, err
}

// selectors returns the vector selectors of a PromQL expression.
func selectors(t *testing.T, expr string) []*parser.VectorSelector {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	require.NoError(t, err, expr)
	var out []*parser.VectorSelector
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if s, ok := n.(*parser.VectorSelector); ok {
			out = append(out, s)
		}
		return nil
	})
	return out
}

// The dashboard is JSON Grafana can provision, and every series it queries
// is one ferry exports, with labels it has: a renamed metric fails here.
func TestDashboardQueriesExportedMetrics(t *testing.T) {
	t.Parallel()
	d := readDashboard(t)
	require.Equal(t, "ferry", d.UID)
	require.NotEmpty(t, d.Title)
	series := exported(t)
	outcomes := []string{metrics.OutcomeAck, metrics.OutcomeRetry, metrics.OutcomeDead, metrics.OutcomeDuplicate}

	queried := map[string]bool{}
	check := func(where, expr string) {
		q, err := promQL(d, expr)
		require.NoError(t, err, "%s: %s", where, expr)
		sels := selectors(t, q)
		require.NotEmpty(t, sels, "%s: %s selects nothing", where, expr)
		for _, s := range sels {
			labels, ok := series[s.Name]
			require.True(t, ok, "%s: %s is not a metric ferry exports", where, s.Name)
			queried[s.Name] = true
			for _, m := range s.LabelMatchers {
				if m.Name == "__name__" {
					continue
				}
				require.Contains(t, labels, m.Name, "%s: %s has no label %s", where, s.Name, m.Name)
				if m.Name == metrics.OutcomeLabel && m.Type.String() == "=" {
					require.Contains(t, outcomes, m.Value, "%s: outcome", where)
				}
			}
		}
	}
	ids := map[int]bool{}
	for _, p := range d.all() {
		require.False(t, ids[p.ID], "panel id %d used twice", p.ID)
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		for _, tg := range p.Targets {
			check(fmt.Sprintf("panel %q %s", p.Title, tg.RefID), tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		require.Equal(t, "query", v.Type)
		inner, ok := strings.CutPrefix(v.Definition, "label_values(")
		require.True(t, ok, "variable %s: %s", v.Name, v.Definition)
		metric, label, ok := strings.Cut(strings.TrimSuffix(inner, ")"), ",")
		require.True(t, ok, v.Definition)
		require.Contains(t, series[strings.TrimSpace(metric)], strings.TrimSpace(label), "variable %s", v.Name)
	}

	// What the issue asks the dashboard to show.
	for _, name := range []string{
		metrics.OutboxUnprocessedRows,             // outbox backlog
		metrics.OutboxOldestAgeSeconds,            // oldest age
		metrics.RelayPublishedTotal,               // publish rate
		metrics.RelayPublishErrorsTotal,           // publish errors
		metrics.WorkerMessagesTotal,               // worker outcomes
		metrics.WorkerHandlerDuration + "_bucket", // handler duration
		metrics.WorkerEndToEndLatency + "_bucket", // create-to-handled percentiles
		metrics.WorkerSettleFailures,              // settle failures (issue 16)
	} {
		require.True(t, queried[name], "the dashboard shows %s", name)
	}
}
