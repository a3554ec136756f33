package ferry_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/outbox"
)

func TestParseSchedule(t *testing.T) {
	at := time.Date(2026, 12, 1, 22, 37, 38, 500_000_000, time.UTC)
	for _, c := range []struct {
		spec string
		next time.Time
	}{
		{"@every 1s", time.Date(2026, 12, 1, 22, 37, 39, 0, time.UTC)},
		{"@every 5m", time.Date(2026, 12, 1, 22, 40, 0, 0, time.UTC)},
		{"*/15 * * * *", time.Date(2026, 12, 1, 22, 45, 0, 0, time.UTC)},                   // UTC by default
		{"*/10 * * * * *", time.Date(2026, 12, 1, 22, 37, 40, 0, time.UTC)},                // seconds field
		{"@daily", time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)},                           // descriptor
		{"CRON_TZ=Europe/Berlin 0 0 * * *", time.Date(2026, 12, 1, 23, 0, 0, 0, time.UTC)}, // midnight in Berlin (UTC+1)
	} {
		s, err := ferry.ParseSchedule(c.spec)
		require.NoError(t, err, c.spec)
		require.True(t, c.next.Equal(s.Next(at)), "%s: next %v, want %v", c.spec, s.Next(at).UTC(), c.next)
	}
	for _, spec := range []string{"", "@every 500ms", "@every x", "61 * * * *", "* * *"} {
		_, err := ferry.ParseSchedule(spec)
		require.ErrorIs(t, err, ferry.ErrInvalidConfig, "%q", spec)
	}
}

func TestPeriodicRefusesBadJobs(t *testing.T) {
	for _, c := range []struct {
		name, schedule, typ string
		opts                []ferry.EnqueueOption
		want                error
		contains            string
	}{
		{"", "@every 1s", "a.b", nil, ferry.ErrInvalidConfig, "name is empty"},
		{strings.Repeat("n", ferry.MaxPeriodicNameBytes+1), "@every 1s", "a.b", nil, ferry.ErrInvalidConfig, "at most"},
		{"j", "@every 0s", "a.b", nil, ferry.ErrInvalidConfig, "shorter"},
		{"j", "@every 1s", "a.*", nil, outbox.ErrInvalidEvent, "Type"},
		{"j", "@every 1s", "a.b", []ferry.EnqueueOption{ferry.DueIn(time.Hour)}, ferry.ErrInvalidConfig, "DueAt"},
	} {
		_, err := ferry.Periodic(c.name, c.schedule, c.typ, struct{}{}, c.opts...)
		require.True(t, errors.Is(err, c.want), "%v", err)
		require.ErrorContains(t, err, c.contains)
	}
	j, err := ferry.Periodic("j", "@every 1s", "a.b", struct{}{})
	require.NoError(t, err)
	_, err = ferry.NewScheduler(ferry.SchedulerConfig{Jobs: []*ferry.PeriodicJob{j}})
	require.ErrorContains(t, err, "SchedulerConfig.Pool")
}

// New takes Config.Periodic: periodic jobs alone are something to run, and
// a nil job or two jobs of one name are refused, naming the field.
func TestNewTakesPeriodicJobs(t *testing.T) {
	bu := setup(t, "nats", "a.b")
	j1, err := ferry.Periodic("j", "@every 1s", "a.b", struct{}{})
	require.NoError(t, err)
	j2, err := ferry.Periodic("j", "@hourly", "a.b", struct{}{})
	require.NoError(t, err)
	cfg := ferry.Config{Pool: bu.pool, Broker: bu.b, Topology: bu.topo, Periodic: []*ferry.PeriodicJob{j1}}
	_, err = ferry.New(cfg)
	require.NoError(t, err)
	cfg.Periodic = []*ferry.PeriodicJob{j1, j2}
	_, err = ferry.New(cfg)
	require.ErrorIs(t, err, ferry.ErrInvalidConfig)
	require.ErrorContains(t, err, `Config.Periodic[1]: name "j" used twice`)
	cfg.Periodic = []*ferry.PeriodicJob{nil}
	_, err = ferry.New(cfg)
	require.ErrorContains(t, err, "Config.Periodic[0]: nil")
}
