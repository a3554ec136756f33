package console_test

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/alert"
	"github.com/ferrymq/ferry/console"
	"github.com/ferrymq/ferry/outbox"
)

// TestOverviewShowsStoredAlertState: a console that does not run the
// stuck-outbox alert (ferry console, beside the relays) shows the state the
// alert's leader on the same database last stored: nothing stored yet
// says so, then a firing alert reads "firing" with since when.
func TestOverviewShowsStoredAlertState(t *testing.T) {
	bu := setup(t, "", console.Config{Token: testToken})
	c := newClient(t, bu.base)
	code, body, _ := c.get("/")
	require.Equal(t, 200, code, body)
	require.Contains(t, body, "not run: no relay runs on this database now")

	// A relay's alert on the same database leads, the backlog at the
	// threshold: nothing is stored, yet the rule runs.
	var backlog atomic.Int64
	a, err := alert.New(alert.Config{
		Threshold: 1, For: time.Millisecond, Interval: 10 * time.Millisecond, Pool: bu.pool,
		Source: func(context.Context) (int, time.Duration, error) { return int(backlog.Load()), time.Minute, nil },
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a.Check(ctx)
	require.True(t, a.Leading())
	_, body, _ = c.get("/")
	require.Contains(t, body, "inactive (a relay on this database leads the alert; the backlog has not gone above its threshold)")

	// Above the threshold for longer than For: firing.
	backlog.Store(5)
	for a.State() != alert.Firing && ctx.Err() == nil {
		a.Check(ctx)
		time.Sleep(5 * time.Millisecond)
	}
	require.Equal(t, alert.Firing, a.State())

	st, found, err := alert.ReadStored(ctx, bu.pool, "")
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, alert.Firing, st.State)
	require.False(t, st.Since.IsZero())
	require.False(t, st.FiredAt.IsZero())
	require.True(t, st.Leader)

	code, body, _ = c.get("/")
	require.Equal(t, 200, code, body)
	require.Contains(t, body, "firing, backlog above the threshold since")
	require.Contains(t, body, "(a relay on this database leads the alert); stored by the alert&#39;s leader at")

	// The leader stops: the stored state stays, and the page says no one
	// runs the rule now.
	require.NoError(t, a.Close())
	_, body, _ = c.get("/")
	require.Contains(t, body, "firing, backlog above the threshold since")
	require.Contains(t, body, "(no relay runs on this database now)")
}

// With a WAL relay on the database (its slot registered in
// outbox_wal_slots), the overview says that published rows are deleted,
// so its published count and the stories cover only the polling side;
// it used to show "Published 28" beside "Handled 968" unexplained.
func TestOverviewSaysWhatWALModeCannotShow(t *testing.T) {
	bu := setup(t, "", console.Config{Token: testToken})
	c := newClient(t, bu.base)
	_, body, _ := c.get("/")
	require.NotContains(t, body, "A WAL relay publishes from this database")
	_, err := bu.pool.Exec(bu.ctx, `INSERT INTO outbox_wal_slots (slot_name, destination, publication) VALUES ('ferry_default', 'default', 'ferry_default')`)
	require.NoError(t, err)
	_, body, _ = c.get("/")
	require.Contains(t, body, "A WAL relay publishes from this database (slot ferry_default)")
	_, body, _ = c.get("/story?q=no-such-app-id")
	require.Contains(t, body, "a WAL relay runs here")
}

// TestOverviewWithARelayRunning: while a relay runs without the alert, the
// alert card says so (it used to say that no relay runs), and the rate
// chart draws the dead-lettered messages beside the published and handled.
func TestOverviewWithARelayRunning(t *testing.T) {
	bu := setup(t, "nats", console.Config{Token: testToken})
	for range 3 {
		bu.enqueue(t, outbox.Event{Type: "job.run", Body: []byte(`{}`)})
	}
	bu.waitDead(t, 3)
	c := newClient(t, bu.base)
	var body string
	// The dead-lettered count is read from the workers' records, written
	// as each message is dead-lettered: wait for the third.
	for i := 0; ; i++ {
		_, body, _ = c.get("/")
		if strings.Contains(body, `data-live="dead_15m">3<`) {
			break
		}
		require.Less(t, i, 100, "the overview never counted 3 dead-lettered:\n%s", body)
		time.Sleep(100 * time.Millisecond)
	}
	require.Contains(t, body, "not run: 1 relay(s) run on this database, none with the alert: give one --alert-threshold")
	require.NotContains(t, body, "no relay runs")
	dead := regexp.MustCompile(`<rect class="dead" x="\d+" y="\d+" width="11" height="(\d+)">`).FindAllStringSubmatch(body, -1)
	require.NotEmpty(t, dead, "the chart has a dead-lettered series")
	tallest := 0
	for _, m := range dead {
		h, _ := strconv.Atoi(m[1])
		tallest = max(tallest, h)
	}
	require.Positive(t, tallest, "a dead-lettered bar is drawn")
	require.Contains(t, body, `<span class="dead">■</span> dead-lettered`)
}
