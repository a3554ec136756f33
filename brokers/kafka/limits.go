package kafka

import (
	"context"
	"fmt"
	"strconv"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/ferrymq/ferry/broker"
)

// checkSessionTimeout refuses a Config.SessionTimeout (which is also the
// group's rebalance timeout) outside the range the broker accepts,
// group.min.session.timeout.ms to group.max.session.timeout.ms (Kafka's
// defaults: 6 s and 30 min): the broker answers every JoinGroup of such a
// member with INVALID_SESSION_TIMEOUT, so the subscription would never
// get a partition. The error wraps broker.ErrUnsupported and names both
// settings and the range. A broker that does not answer within
// Config.DialTimeout is not an error here (the subscription waits for it
// as before, and the join reports a bad timeout then).
func (b *kafkaBroker) checkSessionTimeout(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.DialTimeout)
	defer cancel()
	md, err := b.client.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{}})
	if err != nil || len(md.Brokers) == 0 {
		return nil
	}
	id := strconv.Itoa(md.Brokers[0].ID)
	res, err := b.client.DescribeConfigs(ctx, &kafkago.DescribeConfigsRequest{Resources: []kafkago.DescribeConfigRequestResource{{
		ResourceType: kafkago.ResourceTypeBroker, ResourceName: id,
		ConfigNames: []string{"group.min.session.timeout.ms", "group.max.session.timeout.ms"},
	}}})
	if err != nil {
		return nil
	}
	var lo, hi time.Duration
	for _, r := range res.Resources {
		for _, e := range r.ConfigEntries {
			ms, err := strconv.ParseInt(e.ConfigValue, 10, 64)
			if err != nil {
				continue
			}
			switch e.ConfigName {
			case "group.min.session.timeout.ms":
				lo = time.Duration(ms) * time.Millisecond
			case "group.max.session.timeout.ms":
				hi = time.Duration(ms) * time.Millisecond
			}
		}
	}
	st := b.cfg.SessionTimeout
	if (lo > 0 && st < lo) || (hi > 0 && st > hi) {
		return fmt.Errorf("%w: kafka: Config.SessionTimeout %v (also the group's rebalance timeout) is outside what broker %s accepts, group.min.session.timeout.ms %v to group.max.session.timeout.ms %v: every join of the consumer group would be refused with INVALID_SESSION_TIMEOUT; set Config.SessionTimeout within that range, e.g. %v (the default), or change the broker's settings",
			broker.ErrUnsupported, st, id, lo, hi, min(max(DefaultSessionTimeout, lo), max(hi, lo)))
	}
	return nil
}
