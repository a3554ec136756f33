package alert_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ferrymq/ferry/alert"
)

// The alert fires once the backlog has stayed above the threshold for For,
// and resolves once when it falls back.
func Example() {
	backlog := 250
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a, err := alert.New(alert.Config{
		Threshold: 100,
		For:       5 * time.Minute,
		Source: func(ctx context.Context) (int, time.Duration, error) {
			return backlog, 0, nil
		},
		Now: func() time.Time { return now },
		// Notifiers: []alert.Notifier{webhook, telegram},
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	fmt.Println(a.Check(ctx)) // first observation above 100
	now = now.Add(5 * time.Minute)
	fmt.Println(a.Check(ctx)) // sends "firing" once
	backlog = 0
	now = now.Add(15 * time.Second)
	fmt.Println(a.Check(ctx)) // sends "resolved" once
	// Output:
	// pending
	// firing
	// inactive
}
