package console_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/console"
	"github.com/ferrymq/ferry/outbox"
)

// TestWorkflowPageInBrowser drives the workflow pages in headless
// Chromium (RabbitMQ: the page reads only PostgreSQL). A workflow with a
// fan-out/fan-in diamond that the worker handles, a job held behind a
// scheduled one, and a cancelled job with its cancelled dependent: the
// list links to it, and its graph draws every job with its state and
// every edge, coloured by its dependency's outcome. An unknown id is a 404
// naming it. The screenshot is saved (the path is logged).
func TestWorkflowPageInBrowser(t *testing.T) {
	browser := newBrowser(t)
	dir := artefacts(t)
	bu := setup(t, "rabbitmq", console.Config{})
	bu.failing.Store(false)

	wf := ferry.NewWorkflow("order.fulfil")
	type args struct{ Step string }
	a := ferry.AddJob(wf, "job.run", args{"charge"}, ferry.JobName("charge"))
	b := ferry.AddJob(wf, "job.run", args{"pack"}, ferry.JobName("pack"), ferry.After(a))
	c := ferry.AddJob(wf, "job.run", args{"invoice"}, ferry.JobName("invoice"), ferry.After(a))
	d := ferry.AddJob(wf, "job.run", args{"ship"}, ferry.JobName("ship"), ferry.After(b, c))
	gate := ferry.AddJob(wf, "job.run", args{"tomorrow"}, ferry.JobName("tomorrow"), ferry.DueIn(24*time.Hour))
	held := ferry.AddJob(wf, "job.run", args{"review"}, ferry.JobName("review"), ferry.After(gate, d))
	x := ferry.AddJob(wf, "job.run", args{"gift"}, ferry.JobName("gift wrap"), ferry.After(gate))
	y := ferry.AddJob(wf, "job.run", args{"card"}, ferry.JobName("gift card"), ferry.After(x))
	var wid int64
	var ids []int64
	require.NoError(t, pgx.BeginFunc(bu.ctx, bu.pool, func(tx pgx.Tx) error {
		var err error
		wid, ids, err = ferry.EnqueueWorkflow(bu.ctx, tx, wf)
		return err
	}))
	_, err := outbox.JobCancel(bu.ctx, bu.pool, ids[x.Index()])
	require.NoError(t, err)
	require.Eventually(t, func() bool { return bu.handled.Load() == 4 }, time.Minute, 50*time.Millisecond, "the diamond is handled")

	tab, cancel := chromedp.NewContext(browser)
	defer cancel()
	tab, cancelT := context.WithTimeout(tab, 2*time.Minute)
	defer cancelT()
	require.NoError(t, chromedp.Do(tab,
		chromedp.Navigate(bu.base+"/workflows"),
		chromedp.WaitVisible(chromedp.CSS(`a.wf`)),
		chromedp.Click(chromedp.CSS(`a.wf`)),
		chromedp.WaitVisible(chromedp.CSS(`#graph`)),
	))
	// The worker records "handled" after its commit; wait for the page
	// to say so for the last of the diamond.
	node := func(job ferry.WorkflowJob) string { return fmt.Sprintf(`#node-%d`, ids[job.Index()]) }
	stateOf := func(job ferry.WorkflowJob) string {
		v, err := chromedp.Run(tab, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%q).dataset.state`, node(job))))
		require.NoError(t, err)
		return v
	}
	for stateOf(d) != "handled" {
		require.NoError(t, tab.Err())
		time.Sleep(200 * time.Millisecond)
		require.NoError(t, chromedp.Do(tab, chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`#graph`))))
	}
	title, err := chromedp.Run(tab, chromedp.Title())
	require.NoError(t, err)
	require.Contains(t, title, fmt.Sprintf("Workflow %d · order.fulfil", wid))
	want := map[ferry.WorkflowJob]string{a: "handled", b: "handled", c: "handled", d: "handled",
		gate: "scheduled", held: "held", x: "cancelled", y: "cancelled"}
	for job, st := range want {
		require.Equal(t, st, stateOf(job), "job %d", job.Index())
	}
	nodes, err := chromedp.Run(tab, chromedp.Evaluate[int](`document.querySelectorAll('#graph g.node').length`))
	require.NoError(t, err)
	require.Equal(t, 8, nodes)
	edges, err := chromedp.Run(tab, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('#graph path.edge')).map(e => e.dataset.from + '>' + e.dataset.to + ' ' + e.getAttribute('class')).sort()`))
	require.NoError(t, err)
	e := func(from, to ferry.WorkflowJob, class string) string {
		return fmt.Sprintf("%d>%d edge edge-%s", ids[from.Index()], ids[to.Index()], class)
	}
	wantEdges := []string{e(a, b, "done"), e(a, c, "done"), e(b, d, "done"), e(c, d, "done"),
		e(gate, held, "wait"), e(d, held, "done"), e(gate, x, "wait"), e(x, y, "failed")}
	require.ElementsMatch(t, wantEdges, edges)
	// Columns are layers: ship right of pack, review right of ship.
	xOf := func(job ferry.WorkflowJob) float64 {
		v, err := chromedp.Run(tab, chromedp.Evaluate[float64](fmt.Sprintf(`document.querySelector(%q).getBoundingClientRect().x`, node(job))))
		require.NoError(t, err)
		return v
	}
	require.Less(t, xOf(a), xOf(b))
	require.Less(t, xOf(b), xOf(d))
	require.Less(t, xOf(d), xOf(held))
	require.Equal(t, xOf(b), xOf(c))
	buf, err := chromedp.Run(tab, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "workflow.png"), buf, 0o644))
	t.Logf("screenshot %s", filepath.Join(dir, "workflow.png"))

	require.NoError(t, chromedp.Do(tab,
		chromedp.Navigate(fmt.Sprintf("%s/workflow?id=%d", bu.base, wid+50)),
		chromedp.WaitVisible(chromedp.CSS(`main`)),
	))
	text, err := chromedp.Run(tab, chromedp.Text(chromedp.CSS(`main`)))
	require.NoError(t, err)
	require.Contains(t, text, fmt.Sprintf("outbox: workflow not found: id %d", wid+50))
}
