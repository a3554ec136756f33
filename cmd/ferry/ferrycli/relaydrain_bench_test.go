package ferrycli_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/app"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/cmd/ferry/ferrycli"
	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// BenchmarkCLIRelayDrain measures what `ferry relay` does with its
// defaults on a backlog: 20,000 committed notification events (one
// partition key per 20 events, the app's shape) drained into RabbitMQ,
// from the relay's start to the last row marked, against the same backlog
// drained by outbox.Relay configured as bench/'s RelayThroughput (batch
// 500, 2 claim loops), each on a fresh table (as the API leaves it) and
// after VACUUM ANALYZE (as bench/ measures). Prints rows/s of each and
// their ratio; asserts nothing. Run:
//
//	go test -run '^$' -bench CLIRelayDrain -benchtime 1x ./cmd/ferry/ferrycli/
func BenchmarkCLIRelayDrain(b *testing.B) {
	const rows = 20_000
	drain := func(b *testing.B, vacuum bool, start func(ctx context.Context, dsn, exchange string) <-chan error) float64 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		dsn := testenv.NewDatabase(b)
		pool, err := pgxpool.New(ctx, dsn)
		require.NoError(b, err)
		defer pool.Close()
		code, _, stderr := runArgs(ctx, "migrate", "--database-url", dsn)
		require.Zero(b, code, stderr)
		_, err = pool.Exec(ctx, `INSERT INTO outbox (event_type, partition_key, payload)
			SELECT $1, 'user-' || (g / 20), convert_to('{"notification_id":' || g || ',"user_id":"user-' || (g / 20) || '","channel":"email","to":"someone@example.com","subject":"hello","body":"a body of a few dozen bytes, as in the sample"}', 'UTF8')
			FROM generate_series(1, $2::int) g`, app.EventNotificationRequested, rows)
		require.NoError(b, err)
		if vacuum {
			_, err = pool.Exec(ctx, `VACUUM ANALYZE outbox`)
			require.NoError(b, err)
		}
		exchange := testenv.UniqueName("ferrydrain")
		rctx, stop := context.WithCancel(ctx)
		began := time.Now()
		done := start(rctx, dsn, exchange)
		for {
			var left int
			require.NoError(b, pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE processed_at IS NULL`).Scan(&left))
			if left == 0 {
				break
			}
			select {
			case err := <-done:
				b.Fatalf("relay stopped with %d rows left: %v", left, err)
			case <-time.After(100 * time.Millisecond):
			}
		}
		var last time.Time
		require.NoError(b, pool.QueryRow(ctx, `SELECT max(processed_at) FROM outbox`).Scan(&last))
		stop()
		<-done
		// processed_at is the marking transaction's time (database clock);
		// began is this process's clock: both are the same machine's.
		return rows / last.Sub(began).Seconds()
	}
	for _, vacuum := range []bool{false, true} {
		state := map[bool]string{false: "fresh", true: "vacuumed"}[vacuum]
		b.Run(state, func(b *testing.B) {
			var cli, tuned float64
			b.Run("cli-defaults", func(b *testing.B) {
				cli = drain(b, vacuum, func(ctx context.Context, dsn, exchange string) <-chan error {
					done := make(chan error, 1)
					go func() {
						code, _, stderr := runArgs(ctx, "relay", "--broker", "rabbitmq", "--rabbitmq-url", testenv.RabbitMQURL(),
							"--database-url", dsn, "--exchange", exchange, "--queue", exchange+".q", "--metrics-addr", "127.0.0.1:0", "--log-level", "warn")
						done <- fmt.Errorf("exit %d: %s", code, stderr)
					}()
					return done
				})
				b.ReportMetric(cli, "rows/s")
			})
			b.Run("tuned-library", func(b *testing.B) {
				tuned = drain(b, vacuum, func(ctx context.Context, dsn, exchange string) <-chan error {
					done := make(chan error, 1)
					pool, err := pgxpool.New(ctx, dsn)
					require.NoError(b, err)
					br, err := ferrycli.OpenBroker(ctx, "rabbitmq", ferrycli.BrokerOptions{RabbitMQURL: testenv.RabbitMQURL()})
					require.NoError(b, err)
					require.NoError(b, br.Declare(ctx, broker.Topology{Exchange: exchange,
						Queues: []broker.Queue{{Name: exchange + ".q", Bindings: []string{app.EventNotificationRequested}}}}))
					r, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Broker: br, BatchSize: 500, Concurrency: 2, Retention: -1})
					require.NoError(b, err)
					go func() {
						done <- r.Run(ctx)
						_ = br.Close()
						pool.Close()
					}()
					return done
				})
				b.ReportMetric(tuned, "rows/s")
			})
			if cli > 0 && tuned > 0 {
				b.Logf("%s: ferry relay (defaults) %.0f rows/s, tuned outbox.Relay %.0f rows/s: ratio %.2f", state, cli, tuned, cli/tuned)
			}
		})
	}
}

// runArgs runs the ferry command in-process until ctx is done or it
// returns, with its exit code and stderr.
func runArgs(ctx context.Context, args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := ferrycli.Main(ctx, append([]string{"ferry"}, args...), &out, &errOut)
	return code, out.String(), errOut.String()
}
