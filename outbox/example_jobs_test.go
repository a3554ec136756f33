package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferrymq/ferry/internal/testenv"
	"github.com/ferrymq/ferry/outbox"
)

// ExampleJobCancel finds a reminder scheduled for tomorrow by the
// application's own id, cancels it (it is never published), and shows
// what a cancel of an unknown job says. A job already published is
// refused with ErrTooLate. Runs against the PostgreSQL of
// compose/local/services.sh.
func ExampleJobCancel() {
	ctx := context.Background()
	dsn, drop, err := testenv.ExampleDatabase(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drop()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool); err != nil {
		fmt.Println(err)
		return
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, outbox.Event{Type: "reminder.send", Body: []byte(`{"user":"u42"}`),
			AppID: "reminder-u42", DueAt: time.Now().Add(24 * time.Hour)})
		return err
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	jobs, err := outbox.JobGetByAppID(ctx, pool, "reminder-u42")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(jobs[0].Type, jobs[0].State)

	j, err := outbox.JobCancel(ctx, pool, jobs[0].ID)
	switch {
	case errors.Is(err, outbox.ErrTooLate):
		fmt.Println("already sent:", err)
	case err != nil:
		fmt.Println(err)
	default:
		fmt.Println(j.State, j.History[len(j.History)-1].Detail)
	}

	_, err = outbox.JobCancel(ctx, pool, 1_000_000)
	fmt.Println(errors.Is(err, outbox.ErrJobNotFound))
	// Output:
	// reminder.send scheduled
	// cancelled never published
	// true
}
