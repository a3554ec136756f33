package prometheus_test

import (
	"bytes"
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
	"github.com/ferrymq/ferry/broker"
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
		metrics.OutboxWALRetainedBytes: true, metrics.OutboxWALOldestSeconds: true,
		metrics.RelayPublishedTotal: true, metrics.RelayPublishErrorsTotal: true, metrics.RelayBlocked: true,
		metrics.WorkerMessagesTotal: true, metrics.WorkerSettleFailures: true,
		metrics.QueueOldestAgeSeconds: true, metrics.QueueRetentionSeconds: true, metrics.QueueMessages: true,
	}
	ops := []string{string(broker.SettleAck), string(broker.SettleRetry), string(broker.SettleDeadLetter), string(broker.SettleExtend)}
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
				if m.Name == metrics.OpLabel {
					require.True(t, slices.Contains(ops, m.Value), "%s: op %q", name, m.Value)
				}
				if m.Name == metrics.ReasonLabel {
					require.True(t, slices.Contains(broker.SettleReasons, m.Value), "%s: reason %q", name, m.Value)
				}
			}
			return nil
		})
		require.Positive(t, seen, name)
		require.NotEmpty(t, r.Labels["severity"], name)
		require.NotEmpty(t, r.Annotations["summary"], name)
	}
}

// TestSettleFailureRules: settle failures page (issue 16, item 4):
// sustained failures of any settlement, and any failed dead-lettering.
func TestSettleFailureRules(t *testing.T) {
	t.Parallel()
	rules := parseRules(t)
	for _, name := range []string{"FerryWorkerSettleFailures", "FerryWorkerDeadLetterFailing"} {
		r, ok := rules[name]
		require.True(t, ok, "rule %s missing", name)
		require.Contains(t, r.Expr, metrics.WorkerSettleFailures, name)
		require.Contains(t, r.Annotations["summary"], "{{ $labels.broker }}", name)
	}
	require.Contains(t, rules["FerryWorkerSettleFailures"].Expr, "by (broker, op, reason)")
}

// TestScrapeConfigLoadsTheRules: prometheus.yml is YAML with only keys
// this test knows (decoded strictly), loads alerts.yml and scrapes the
// ferry job by DNS service discovery of the roles' network aliases
// (compose/compose_test.go checks the aliases and ports against
// compose.yaml).
func TestScrapeConfigLoadsTheRules(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("prometheus.yml")
	require.NoError(t, err)
	var cfg struct {
		Global struct {
			ScrapeInterval     string `yaml:"scrape_interval"`
			EvaluationInterval string `yaml:"evaluation_interval"`
		} `yaml:"global"`
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName      string `yaml:"job_name"`
			DNSSDConfigs []struct {
				Names           []string `yaml:"names"`
				Type            string   `yaml:"type"`
				Port            int      `yaml:"port"`
				RefreshInterval string   `yaml:"refresh_interval"`
			} `yaml:"dns_sd_configs"`
			RelabelConfigs []struct {
				SourceLabels []string `yaml:"source_labels"`
				Regex        string   `yaml:"regex"`
				TargetLabel  string   `yaml:"target_label"`
			} `yaml:"relabel_configs"`
		} `yaml:"scrape_configs"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(&cfg))
	require.Equal(t, []string{"alerts.yml"}, cfg.RuleFiles)
	for _, d := range []string{cfg.Global.ScrapeInterval, cfg.Global.EvaluationInterval} {
		_, err := model.ParseDuration(d)
		require.NoError(t, err, d)
	}
	require.Len(t, cfg.ScrapeConfigs, 1)
	job := cfg.ScrapeConfigs[0]
	require.Equal(t, "ferry", job.JobName)
	require.Len(t, job.DNSSDConfigs, 3)
	for _, sd := range job.DNSSDConfigs {
		require.Equal(t, "A", sd.Type, "A records: one per container")
		require.NotEmpty(t, sd.Names)
		require.Positive(t, sd.Port)
		_, err := model.ParseDuration(sd.RefreshInterval)
		require.NoError(t, err)
	}
	require.Len(t, job.RelabelConfigs, 1)
	require.Equal(t, []string{"__meta_dns_name"}, job.RelabelConfigs[0].SourceLabels)
	require.Equal(t, "role", job.RelabelConfigs[0].TargetLabel)
}

// TestQueueNearRetentionRule: the rule compares the two backlog gauges of
// package metrics per broker and queue, ignores queues without a
// retention (0: kept until consumed) and fires at half of it, so that an
// operator hears of a backlog before Kafka's retention (or a JetStream
// MaxAge) deletes unread messages, which no DLQ sees.
func TestQueueNearRetentionRule(t *testing.T) {
	t.Parallel()
	r, ok := parseRules(t)["FerryQueueNearRetention"]
	require.True(t, ok)
	expr, err := parser.NewParser(parser.Options{}).ParseExpr(r.Expr)
	require.NoError(t, err)
	cmp, ok := expr.(*parser.BinaryExpr)
	require.True(t, ok, "a comparison, got %T", expr)
	require.Equal(t, ">", cmp.Op.String())
	require.Equal(t, 0.5, cmp.RHS.(*parser.NumberLiteral).Val)
	agg, ok := cmp.LHS.(*parser.AggregateExpr)
	require.True(t, ok)
	require.ElementsMatch(t, []string{metrics.BrokerLabel, metrics.QueueLabel}, agg.Grouping)
	div, ok := unparen(agg.Expr).(*parser.BinaryExpr)
	require.True(t, ok)
	require.Equal(t, "/", div.Op.String())
	require.Equal(t, metrics.QueueOldestAgeSeconds, div.LHS.(*parser.VectorSelector).Name)
	filter, ok := unparen(div.RHS).(*parser.BinaryExpr)
	require.True(t, ok, "the retention is filtered to > 0")
	require.Equal(t, ">", filter.Op.String())
	require.Equal(t, metrics.QueueRetentionSeconds, filter.LHS.(*parser.VectorSelector).Name)
	require.Equal(t, 0.0, filter.RHS.(*parser.NumberLiteral).Val)
	require.Equal(t, "critical", r.Labels["severity"])
}

func unparen(e parser.Expr) parser.Expr {
	for {
		p, ok := e.(*parser.ParenExpr)
		if !ok {
			return e
		}
		e = p.Expr
	}
}

// TestWALSlotRule: the WAL relay's retained WAL and oldest unconfirmed
// event have a rule (issue 20), per broker like the stuck-outbox rule.
func TestWALSlotRule(t *testing.T) {
	t.Parallel()
	r, ok := parseRules(t)["FerryWALSlotRetaining"]
	require.True(t, ok, "rule FerryWALSlotRetaining missing")
	require.Contains(t, r.Expr, metrics.OutboxWALRetainedBytes)
	require.Contains(t, r.Expr, metrics.OutboxWALOldestSeconds)
	require.Contains(t, r.Expr, "max by (broker)")
	require.Equal(t, "critical", r.Labels["severity"])
}
