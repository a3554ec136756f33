// Package bench holds ferry's end-to-end benchmarks: the figures the
// performance issues ask for, measured against the real servers started by
// compose/local/services.sh (PostgreSQL, RabbitMQ, NATS JetStream).
//
// The package has no API; everything is in its _test.go files, so the
// normal `go test ./...` compiles it and runs nothing. Run the figures with
//
//	go test -run '^$' -bench . -benchtime 1x ./bench/
//
// See README.md for what each figure means and the settings used. The
// user-facing comparison, `ferry bench`, lives in the sub-package suite;
// the raw publishers in the relay's shape are shared from there.
// Benchmarks print figures; they never assert on timings.
package bench
