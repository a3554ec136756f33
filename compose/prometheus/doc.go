// Package prometheus holds ferry's Prometheus configuration: alerts.yml, the
// alerting rules (FerryOutboxStuck mirrors the built-in alert of package
// alert), and prometheus.yml, a scrape configuration for the local stack.
// It has no Go API; its test parses the rules with Prometheus's own rule
// parser (model/rulefmt) and checks them against ferry's metric names and
// the built-in alert's defaults.
package prometheus
