// Package suite is the engine of `ferry bench`: the same application and
// workload on every broker, against the real servers, reported as
// results.json, a Markdown table (results.md) and one chart per scenario
// (SVG and PNG, drawn with gonum.org/v1/plot).
//
// The brokers come from the caller (Config.Targets, built by the ferry
// command from ferrycli.Brokers), so a broker added to the command is
// benchmarked without a change here; this package imports no adapter. The
// raw baselines use each broker's own client (amqp091-go, nats.go
// jetstream, kafka-go, aws-sdk-go-v2/service/sqs) on a topic or queue of
// their own; a broker without a raw client gets "not supported" for raw
// and replay.
//
// Scenarios (see bench/README.md): raw, pipeline, end-to-end, latency,
// faults, ordering, routing (exact, '*' and '#' bindings: what each
// queue received against what the patterns say), retry, replay and peer
// (the Watermill module, bench/watermill, run with the go command). The faults
// scenario runs the relay and the worker as child processes
// (Config.Spawn, `ferry bench-child`, see RunChild) so it can kill them
// with SIGKILL, and restarts the broker through Config.RestartBroker.
// failover, run only when named (not in BuiltScenarios), takes each
// broker's cluster from Target.Cluster and kills the node that leads the
// work queue (see Cluster). soak, run only when named too, runs the
// faults scenario's children for Config.SoakDuration with a fault every
// Config.SoakFaultEvery and prints a SoakRow per fault (the children
// report their heap and goroutines in ChildConfig.StatsFile), then each
// series' flatness; it fails on an event lost or an effect applied twice.
//
// At the end Run records what each adapter declares (broker.Capabilities)
// and each server's processes and resident memory, read from /proc.
//
// Every scenario's relay is the polling relay with one worker transaction
// per message, except the second run of end-to-end and of peer and the
// last run of latency (VariantWALBatch: the WAL relay and batched worker
// commits); each Result's RelayMode says which.
//
// Elsewhere the relay and the worker run inside the calling process, each with its
// own database pool and broker connection; every scenario run gets a fresh
// database (created on Config.DatabaseURL's server and dropped after it)
// and uniquely named exchanges and queues. Figures are reported, never
// asserted: a scenario that fails on a broker is a result with status
// "failed" and its error.
package suite
