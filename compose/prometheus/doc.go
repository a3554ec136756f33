// Package prometheus holds ferry's Prometheus configuration: alerts.yml, the
// alerting rules (FerryOutboxStuck mirrors the built-in alert of package
// alert), and prometheus.yml, the scrape configuration that the
// observability profile of compose/compose.yaml mounts at /etc/prometheus
// (it finds the ferry roles by DNS service discovery of their network
// aliases). It has no Go API; its test parses the rules with Prometheus's
// own rule parser (model/rulefmt) and checks them against ferry's metric
// names and the built-in alert's defaults.
package prometheus
