package ferrycli

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ferrymq/ferry/broker"
)

const flagSince = "since"

// ErrNoReplay is returned by `ferry replay` on a broker without the
// Replay capability (broker.Capabilities.Replay, broker.HistoryReplayer):
// RabbitMQ and SQS delete a message once it is acked.
var ErrNoReplay = errors.New("ferry: replay: the broker lacks the Replay capability")

func replayCommand() *cli.Command {
	return &cli.Command{
		Name: "replay",
		Usage: "make --queue read its history again from --since (Kafka: reset the consumer group's offsets to that time); " +
			"the queue's workers must be stopped; fails at once on a broker without the Replay capability",
		// No --rabbitmq-queue-type and no --exchange: only Kafka replays,
		// and it needs neither.
		Flags: concat(without(brokerFlags(false, ""), flagRabbitQueueType), []cli.Flag{queueFlag()}, logFlags("warn"), []cli.Flag{
			&cli.StringFlag{Name: flagSince, Required: true, Usage: "the time to replay from: RFC 3339 (2026-12-01T09:00:00Z) or a duration back from now (90m)"},
		}),
		Action: replayAction,
	}
}

// parseSince reads --since: an RFC 3339 time, or a positive duration
// before now.
func parseSince(v string, now time.Time) (time.Time, error) {
	v = strings.TrimSpace(v)
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, usagef("--%s %q: want an RFC 3339 time (2026-12-01T09:00:00Z) or a positive duration (90m)", flagSince, v)
}

func replayAction(c *cli.Context) error {
	s, log, err := setup(c, "warn")
	if err != nil {
		return err
	}
	since, err := parseSince(c.String(flagSince), time.Now())
	if err != nil {
		return err
	}
	if since.After(time.Now()) {
		return usagef("--%s %s is in the future", flagSince, since.Format(time.RFC3339))
	}
	opts := s.brokerOpts
	opts.Logger = log
	b, err := OpenBroker(c.Context, s.broker, opts)
	if err != nil {
		if namesFlag(err) {
			return err
		}
		return fmt.Errorf("ferry: replay: %s at %s: %w", s.broker, redactURL(s.brokerURL()), err)
	}
	defer b.Close()
	hr, ok := b.(broker.HistoryReplayer)
	if !b.Capabilities().Replay || !ok {
		return fmt.Errorf("%w (%s deletes a message once it is acked, so its history cannot be read again; replay dead messages with `ferry dlq replay`): %w",
			ErrNoReplay, s.broker, broker.ErrUnsupported)
	}
	n, err := hr.ReplaySince(c.Context, s.queue, since)
	if err != nil {
		return fmt.Errorf("ferry: replay: queue %s on %s: %w", s.queue, s.broker, err)
	}
	fmt.Fprintf(c.App.Writer, "queue %s will read again %d message(s) stored since %s; start its workers (the idempotent consumer skips those already handled)\n",
		s.queue, n, since.UTC().Format(time.RFC3339))
	return nil
}
