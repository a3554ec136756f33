package ferrycli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// TestJobsGetListCancel runs the binary: ferry jobs get by ID and by app
// id, list by state, cancel of a scheduled job with --yes (and a usage
// error without it), cancel of a published job refused as too late with
// exit 1 and no result line, and an unknown ID not found.
func TestJobsGetListCancel(t *testing.T) {
	db := testenv.NewDatabase(t)
	code, errOut := runFor(t, 30*time.Second, "migrate", "--database-url", db)
	require.Equal(t, 0, code, errOut)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, db)
	require.NoError(t, err)
	defer pool.Close()
	var ids []int64
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		ids, err = outbox.Enqueue(ctx, tx,
			outbox.Event{Type: "mail.send", Body: []byte(`{}`), AppID: "n-7", DueAt: time.Now().Add(time.Hour)},
			outbox.Event{Type: "mail.send", Body: []byte(`{}`), AppID: "n-8"})
		return err
	}))
	sched, pub := fmt.Sprint(ids[0]), fmt.Sprint(ids[1])
	// Stand in for the relay's mark of the second row.
	_, err = pool.Exec(ctx, `UPDATE outbox SET processed_at = now() WHERE id = $1`, ids[1])
	require.NoError(t, err)

	code, out, errOut := runBinaryEnv(t, nil, "jobs", "get", "--database-url", db, sched)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `state\s+scheduled\n`, out)
	require.Regexp(t, `app id\s+n-7\n`, out)

	code, out, errOut = runBinaryEnv(t, nil, "jobs", "get", "--database-url", db, "--format", "json", "--app-id", "n-8")
	require.Equal(t, 0, code, errOut)
	var got []struct {
		ID    int64  `json:"id"`
		State string `json:"state"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.Equal(t, ids[1], got[0].ID)
	require.Equal(t, "published", got[0].State)

	code, out, errOut = runBinaryEnv(t, nil, "jobs", "list", "--database-url", db, "--state", "scheduled")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, sched+`\s+scheduled\s+default\s+mail.send\s+n-7`, out)
	require.Contains(t, out, "1 job(s)\n")

	code, out, errOut = runBinaryEnv(t, nil, "jobs", "cancel", "--database-url", db, sched)
	require.Equal(t, 2, code, errOut)
	require.Empty(t, out)
	require.Contains(t, errOut, "add --yes to confirm")

	code, out, errOut = runBinaryEnv(t, nil, "jobs", "cancel", "--database-url", db, "--yes", sched)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "cancelled 1 job(s), never to be published: "+sched+"\n", out)
	require.Contains(t, errOut, "jobs cancel")
	require.Contains(t, errOut, "by=")

	code, out, errOut = runBinaryEnv(t, nil, "jobs", "cancel", "--database-url", db, "--yes", "--app-id", "n-7")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "cancelled 0 job(s), never to be published (already cancelled: "+sched+")\n", out)

	code, out, errOut = runBinaryEnv(t, nil, "jobs", "cancel", "--database-url", db, "--yes", "--app-id", "n-8")
	require.Equal(t, 1, code, errOut)
	require.Empty(t, out)
	require.Contains(t, errOut, "too late to cancel the job: job "+pub+" was published at")

	code, out, errOut = runBinaryEnv(t, nil, "jobs", "cancel", "--database-url", db, "--yes", pub)
	require.Equal(t, 1, code, errOut)
	require.Empty(t, out, "a failing command prints no result line")
	require.Contains(t, errOut, "too late to cancel the job: job "+pub+" was published at")

	code, out, errOut = runBinaryEnv(t, nil, "jobs", "get", "--database-url", db, "424242")
	require.Equal(t, 1, code, errOut)
	require.Empty(t, out)
	require.Contains(t, errOut, "job not found: id 424242")

	code, _, errOut = runBinaryEnv(t, nil, "jobs", "list", "--database-url", db, "--state", "lost")
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, `--state "lost"`)

	code, out, errOut = runBinaryEnv(t, nil, "jobs", "list", "--database-url", db, "--state", "cancelled", "--format", "json")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `"state": "cancelled"`)
}

// TestJobsWorkflow runs the binary: ferry jobs workflow shows a workflow's
// jobs with their layers and states, as a table and as JSON; an unknown
// id is not found (exit 1), a missing or malformed one a usage error.
func TestJobsWorkflow(t *testing.T) {
	db := testenv.NewDatabase(t)
	code, errOut := runFor(t, 30*time.Second, "migrate", "--database-url", db)
	require.Equal(t, 0, code, errOut)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, db)
	require.NoError(t, err)
	defer pool.Close()
	ev := func(typ string) outbox.Event { return outbox.Event{Type: typ, Body: []byte(`{}`)} }
	var wid int64
	var ids []int64
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		wid, ids, err = outbox.EnqueueWorkflow(ctx, tx, outbox.Workflow{Name: "order.fulfil", Jobs: []outbox.WorkflowJob{
			{Name: "charge", Event: ev("payment.charge")},
			{Name: "ship", Event: ev("order.ship"), After: []int{0}},
		}})
		return err
	}))
	code, out, errOut := runBinaryEnv(t, nil, "jobs", "workflow", "--database-url", db, fmt.Sprint(wid))
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, fmt.Sprintf(`workflow %d "order.fulfil"`, wid))
	require.Regexp(t, fmt.Sprintf(`0\s+%d\s+charge\s+payment.charge\s+pending\s+-\s+0\s+-\n`, ids[0]), out)
	require.Regexp(t, fmt.Sprintf(`1\s+%d\s+ship\s+order.ship\s+held\s+%d\s+1\s+-\n`, ids[1], ids[0]), out)

	code, out, errOut = runBinaryEnv(t, nil, "jobs", "workflow", "--database-url", db, "--format", "json", fmt.Sprint(wid))
	require.Equal(t, 0, code, errOut)
	var got struct {
		Name string `json:"name"`
		Jobs []struct {
			ID    int64   `json:"id"`
			State string  `json:"state"`
			After []int64 `json:"after"`
		} `json:"jobs"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.Equal(t, "order.fulfil", got.Name)
	require.Equal(t, "held", got.Jobs[1].State)
	require.Equal(t, []int64{ids[0]}, got.Jobs[1].After)

	code, out, errOut = runBinaryEnv(t, nil, "jobs", "get", "--database-url", db, fmt.Sprint(ids[1]))
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `state\s+held\n`, out)
	require.Contains(t, out, fmt.Sprintf("ferry jobs workflow %d", wid))

	code, out, errOut = runBinaryEnv(t, nil, "jobs", "workflow", "--database-url", db, fmt.Sprint(wid+99))
	require.Equal(t, 1, code, errOut)
	require.Empty(t, out)
	require.Contains(t, errOut, fmt.Sprintf("ferry: jobs workflow: outbox: workflow not found: id %d", wid+99))
	code, _, errOut = runBinaryEnv(t, nil, "jobs", "workflow", "--database-url", db)
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, "say which workflow")
	code, _, errOut = runBinaryEnv(t, nil, "jobs", "workflow", "--database-url", db, "abc")
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, `WORKFLOW-ID "abc": want a positive workflow id`)
}
