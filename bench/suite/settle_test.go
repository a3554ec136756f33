package suite

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/ferrymq/ferry/broker"
)

// errElection is what a JetStream cluster answers while its meta group
// elects a leader.
var errElection = errors.New("nats: API error: code=503 err_code=10008 description=JetStream system temporarily unavailable")

// TestSettleWaitsOutAnElection: open and declare try again while the
// broker answers with a passing error (the failover scenario failed at its
// start when three tries half a second apart fell within an election),
// and stop at once on an error no wait changes.
func TestSettleWaitsOutAnElection(t *testing.T) {
	calls := 0
	err := settle(context.Background(), func(ctx context.Context) error {
		if _, ok := ctx.Deadline(); !ok {
			t.Fatal("an attempt has no deadline: a request the old leader never answers would hold it")
		}
		if calls++; calls <= 4 {
			return errElection
		}
		return nil
	})
	if err != nil || calls != 5 {
		t.Fatalf("settle = %v after %d calls, want nil after 5 (four refusals during the election)", err, calls)
	}

	for _, perm := range []error{broker.ErrRefused, broker.ErrInvalidConfig, broker.ErrUnsupported, broker.ErrTopologyMismatch} {
		calls = 0
		wrapped := fmt.Errorf("nats: connect: %w", perm)
		err = settle(context.Background(), func(context.Context) error { calls++; return wrapped })
		if !errors.Is(err, perm) || calls != 1 {
			t.Errorf("settle with %v = %v after %d calls, want it returned after 1", perm, err, calls)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	calls = 0
	err = settle(ctx, func(context.Context) error { calls++; cancel(); return errElection })
	if !errors.Is(err, context.Canceled) || calls != 1 {
		t.Errorf("settle on a cancelled ctx = %v after %d calls, want context.Canceled after 1", err, calls)
	}
}
