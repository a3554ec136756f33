package metrics_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/metrics"
)

type backlogFunc func(ctx context.Context, queue string) (broker.Backlog, error)

func (f backlogFunc) Backlog(ctx context.Context, queue string) (broker.Backlog, error) {
	return f(ctx, queue)
}

// TestQueueCollector: the backlog gauges carry the broker and queue
// labels and the values the broker reported at scrape time; a failed read
// omits them.
func TestQueueCollector(t *testing.T) {
	var fail bool
	c, err := metrics.NewQueueCollector("kafka", "notifications.send", backlogFunc(func(_ context.Context, q string) (broker.Backlog, error) {
		require.Equal(t, "notifications.send", q)
		if fail {
			return broker.Backlog{}, errors.New("down")
		}
		return broker.Backlog{Messages: 42, OldestAge: 90 * time.Second, Retention: 7 * 24 * time.Hour}, nil
	}), 0)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(c))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, mf := range mfs {
		require.Len(t, mf.GetMetric(), 1, mf.GetName())
		m := mf.GetMetric()[0]
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		require.Equal(t, map[string]string{"broker": "kafka", "queue": "notifications.send"}, labels, mf.GetName())
		got[mf.GetName()] = m.GetGauge().GetValue()
	}
	require.Equal(t, map[string]float64{metrics.QueueMessages: 42, metrics.QueueOldestAgeSeconds: 90, metrics.QueueRetentionSeconds: 604800}, got)
	fail = true
	_, err = reg.Gather()
	require.ErrorContains(t, err, "down")

	_, err = metrics.NewQueueCollector("", "q", backlogFunc(nil), 0)
	require.ErrorIs(t, err, metrics.ErrConfig)
	_, err = metrics.NewQueueCollector("kafka", "q", nil, 0)
	require.ErrorIs(t, err, metrics.ErrConfig)
}
