package console

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/ferrymq/ferry/outbox"
)

// The workflow graph's geometry (SVG user units, pixels at 100 %): one
// column per layer (outbox.WorkflowJobInfo.Layer), one row per job in it.
const (
	graphNodeW   = 190
	graphNodeH   = 40
	graphColGap  = 90
	graphRowGap  = 12
	graphMargin  = 16
	graphMaxJobs = 2000 // larger workflows are listed, not drawn
)

type workflowsData struct {
	Workflows []outbox.WorkflowSummary
}

func (c *Console) workflowsPage(w http.ResponseWriter, r *http.Request) {
	list, err := outbox.WorkflowList(r.Context(), c.cfg.Pool, 100)
	if err != nil {
		c.failErr(w, r, "reading the workflows", err)
		return
	}
	c.render(w, r, http.StatusOK, "workflows", "Workflows", workflowsData{Workflows: list})
}

// graphNode is one job drawn in the workflow graph.
type graphNode struct {
	outbox.WorkflowJobInfo
	X, Y int
}

// graphEdge is one dependency drawn: from the right side of the
// dependency to the left side of the job. Settled is true once the
// dependency completed.
type graphEdge struct {
	From, To       int64
	X1, Y1, X2, Y2 int
	MidX           int
	Class          string
}

type workflowData struct {
	WF            outbox.WorkflowInfo
	Nodes         []graphNode
	Edges         []graphEdge
	Width, Height int
	Drawn         bool
	States        map[outbox.JobState]int
}

func (c *Console) workflowPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query().Get("id")
	id, err := strconv.ParseInt(q, 10, 64)
	if err != nil || id <= 0 {
		c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("id %q: want a positive workflow id", q))
		return
	}
	wf, err := outbox.WorkflowGet(r.Context(), c.cfg.Pool, id)
	if errors.Is(err, outbox.ErrWorkflowNotFound) {
		c.fail(w, r, http.StatusNotFound, err.Error())
		return
	}
	if err != nil {
		c.failErr(w, r, "reading the workflow", err)
		return
	}
	d := workflowData{WF: wf, States: map[outbox.JobState]int{}}
	for _, j := range wf.Jobs {
		d.States[j.State]++
	}
	if len(wf.Jobs) <= graphMaxJobs {
		d.Drawn = true
		rows := map[int]int{}
		at := map[int64]graphNode{}
		for _, j := range wf.Jobs {
			n := graphNode{WorkflowJobInfo: j,
				X: graphMargin + j.Layer*(graphNodeW+graphColGap),
				Y: graphMargin + rows[j.Layer]*(graphNodeH+graphRowGap)}
			rows[j.Layer]++
			at[j.ID] = n
			d.Nodes = append(d.Nodes, n)
			d.Width = max(d.Width, n.X+graphNodeW+graphMargin)
			d.Height = max(d.Height, n.Y+graphNodeH+graphMargin)
		}
		for _, n := range d.Nodes {
			for _, dep := range n.After {
				from, ok := at[dep]
				if !ok {
					continue
				}
				e := graphEdge{From: dep, To: n.ID, X1: from.X + graphNodeW, Y1: from.Y + graphNodeH/2, X2: n.X, Y2: n.Y + graphNodeH/2, Class: "wait"}
				e.MidX = (e.X1 + e.X2) / 2
				switch from.Outcome {
				case "completed":
					e.Class = "done"
				case "failed", "cancelled":
					e.Class = "failed"
				}
				d.Edges = append(d.Edges, e)
			}
		}
	}
	c.render(w, r, http.StatusOK, "workflow", fmt.Sprintf("Workflow %d · %s", wf.ID, wf.Name), d)
}
