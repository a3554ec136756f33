package brokertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry/broker"
)

// ConnectCases are the ways an adapter's New must fail, for
// RunConnectErrors. Each function calls the adapter's New with ctx and
// returns what New returned (the suite closes a broker it gets).
type ConnectCases struct {
	// Malformed calls New with a Config whose address field is malformed
	// (a wrong scheme, a missing port). Required. Field is the Config
	// field the *broker.ConfigError must name.
	Malformed func(ctx context.Context) (broker.Broker, error)
	Field     string
	// Unreachable calls New with the address of a loopback port nothing
	// listens on (connection refused). Required.
	Unreachable func(ctx context.Context) (broker.Broker, error)
	// Refused calls New with credentials (or a vhost) the real server
	// refuses. Nil when the server under test checks none (Kafka
	// PLAINTEXT, ElasticMQ): the suite then logs that it is not checked.
	Refused func(ctx context.Context) (broker.Broker, error)
	// RefusedWords is a piece of the server's own reason that the
	// refusal's error must keep, e.g. "Authorization Violation".
	RefusedWords string
}

// RunConnectErrors checks the contract of New's errors (package broker,
// ErrInvalidConfig, ErrRefused, IsPermanent): a malformed address is a
// *broker.ConfigError naming the field, refused before any network
// access; credentials the server refuses wrap broker.ErrRefused and keep
// the server's words; an unreachable server (New's ctx ends after 5 s) is
// an error for which broker.IsPermanent is false. It prints how long each
// case took (no timed assertion).
func RunConnectErrors(t *testing.T, c ConnectCases) {
	require.NotNil(t, c.Malformed, "brokertest: ConnectCases.Malformed is required")
	require.NotNil(t, c.Unreachable, "brokertest: ConnectCases.Unreachable is required")
	run := func(t *testing.T, f func(context.Context) (broker.Broker, error), timeout time.Duration) error {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		start := time.Now()
		b, err := f(ctx)
		t.Logf("New returned after %v: %v", time.Since(start).Round(time.Millisecond), err)
		if b != nil {
			_ = b.Close()
		}
		require.Error(t, err, "New must fail")
		return err
	}
	t.Run("Malformed", func(t *testing.T) {
		t.Parallel()
		err := run(t, c.Malformed, 30*time.Second)
		require.ErrorIs(t, err, broker.ErrInvalidConfig)
		require.True(t, broker.IsPermanent(err))
		var ce *broker.ConfigError
		require.True(t, errors.As(err, &ce), "want a *broker.ConfigError: %v", err)
		require.Equal(t, c.Field, ce.Field)
		require.NotEmpty(t, ce.Adapter)
		require.NotEmpty(t, ce.Reason)
	})
	t.Run("Unreachable", func(t *testing.T) {
		t.Parallel()
		err := run(t, c.Unreachable, 5*time.Second)
		require.False(t, broker.IsPermanent(err), "an unreachable server can come back: %v", err)
		require.NotErrorIs(t, err, broker.ErrRefused)
		require.NotErrorIs(t, err, broker.ErrInvalidConfig)
	})
	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		if c.Refused == nil {
			t.Log("the server under test checks no credentials: not checked")
			return
		}
		err := run(t, c.Refused, 30*time.Second)
		require.ErrorIs(t, err, broker.ErrRefused)
		require.True(t, broker.IsPermanent(err))
		require.NotErrorIs(t, err, broker.ErrInvalidConfig)
		require.ErrorContains(t, err, c.RefusedWords)
	})
}
