// Package compose holds ferry's deployment files, not Go code:
// compose.yaml (the servers and ferry's roles in containers, one broker
// per profile: rabbitmq, kafka, nats, sqs, and an observability profile
// with Prometheus and Grafana), Dockerfile (the ferry image),
// postgres/initdb.sql (one database per broker profile), prometheus/ (the
// scrape configuration and alerting rules), grafana/ (the provisioned data
// source and the ferry dashboard, kept as JSON) and local/services.sh (the
// same servers without Docker, for development and CI).
//
// There is no Docker engine in CI, so its test loads compose.yaml with the
// Compose Specification's own loader (compose-go, what `docker compose`
// uses) for every profile and checks what a user relies on: the services
// of each profile, a healthcheck on every long-running one, the start
// order (depends_on conditions), that every FERRY_* variable is a flag of
// the command the role runs (read from the CLI itself), that each role
// names its profile's broker service, port and database, host ports at
// the CLI's defaults that no two profiles share, pinned image tags, and
// that every metric the dashboard queries is one ferry exports. Negative
// fixtures in testdata/ show that the checks fail on what they catch.
package compose
