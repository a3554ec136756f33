package prometheus_test

import (
	"log/slog"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/ferrymq/ferry/alert"
	"github.com/ferrymq/ferry/metrics"
)

func parseRules(t *testing.T) map[string]rulefmt.Rule {
	t.Helper()
	groups, errs := rulefmt.ParseFile("alerts.yml", false, model.UTF8Validation,
		parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	require.Empty(t, errs, "rulefmt rejected alerts.yml")
	require.Len(t, groups.Groups, 1)
	require.Equal(t, "ferry-outbox", groups.Groups[0].Name)
	rules := map[string]rulefmt.Rule{}
	for _, r := range groups.Groups[0].Rules {
		require.NotEmpty(t, r.Alert, "only alerting rules here")
		require.NotContains(t, rules, r.Alert, "duplicate alert name")
		rules[r.Alert] = r
	}
	return rules
}

// TestOutboxStuckRuleMatchesBuiltInAlert: the Prometheus rule and package
// alert must page on the same condition.
func TestOutboxStuckRuleMatchesBuiltInAlert(t *testing.T) {
	t.Parallel()
	r, ok := parseRules(t)[alert.DefaultName]
	require.True(t, ok, "rule %s missing", alert.DefaultName)

	require.Equal(t, "max by (broker) (ferry_outbox_unprocessed_rows) > 100", r.Expr)
	require.Equal(t, model.Duration(alert.DefaultFor), r.For)
	require.Equal(t, model.Duration(5*time.Minute), r.For)
	require.Equal(t, map[string]string{"severity": "critical", "service": "ferry"}, r.Labels)
	require.Contains(t, r.Annotations["summary"], "{{ $labels.broker }}")

	expr, err := parser.NewParser(parser.Options{}).ParseExpr(r.Expr)
	require.NoError(t, err)
	cmp, ok := expr.(*parser.BinaryExpr)
	require.True(t, ok, "expr is a comparison, got %T", expr)
	require.Equal(t, ">", cmp.Op.String(), "strictly above, like alert.Config.Threshold")
	num, ok := cmp.RHS.(*parser.NumberLiteral)
	require.True(t, ok)
	require.Equal(t, float64(alert.DefaultThreshold), num.Val)
	agg, ok := cmp.LHS.(*parser.AggregateExpr)
	require.True(t, ok)
	require.Equal(t, "max", agg.Op.String())
	require.Equal(t, []string{metrics.BrokerLabel}, agg.Grouping)
	sel, ok := agg.Expr.(*parser.VectorSelector)
	require.True(t, ok)
	require.Equal(t, metrics.OutboxUnprocessedRows, sel.Name)
}

// TestRulesUseExportedMetrics: every series a rule selects is one package
// metrics exports, with labels it has.
func TestRulesUseExportedMetrics(t *testing.T) {
	t.Parallel()
	known := map[string]bool{
		metrics.OutboxUnprocessedRows: true, metrics.OutboxOldestAgeSeconds: true,
		metrics.RelayPublishedTotal: true, metrics.RelayPublishErrorsTotal: true,
		metrics.WorkerMessagesTotal: true,
	}
	outcomes := []string{metrics.OutcomeAck, metrics.OutcomeRetry, metrics.OutcomeDead, metrics.OutcomeDuplicate, metrics.OutcomeUnsettled}
	p := parser.NewParser(parser.Options{})
	for name, r := range parseRules(t) {
		expr, err := p.ParseExpr(r.Expr)
		require.NoError(t, err, name)
		seen := 0
		parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
			sel, ok := n.(*parser.VectorSelector)
			if !ok {
				return nil
			}
			seen++
			require.True(t, known[sel.Name], "%s selects unknown metric %q", name, sel.Name)
			for _, m := range sel.LabelMatchers {
				if m.Name == metrics.OutcomeLabel {
					require.True(t, slices.Contains(outcomes, m.Value), "%s: outcome %q", name, m.Value)
				}
			}
			return nil
		})
		require.Positive(t, seen, name)
		require.NotEmpty(t, r.Labels["severity"], name)
		require.NotEmpty(t, r.Annotations["summary"], name)
	}
}

// TestScrapeConfigLoadsTheRules: prometheus.yml is YAML that loads
// alerts.yml and scrapes the ferry job.
func TestScrapeConfigLoadsTheRules(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("prometheus.yml")
	require.NoError(t, err)
	var cfg struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	require.NoError(t, yaml.Unmarshal(data, &cfg))
	require.Equal(t, []string{"alerts.yml"}, cfg.RuleFiles)
	require.Len(t, cfg.ScrapeConfigs, 1)
	require.Equal(t, "ferry", cfg.ScrapeConfigs[0].JobName)
	require.NotEmpty(t, cfg.ScrapeConfigs[0].StaticConfigs[0].Targets)
}
