package ferry_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ferrymq/ferry"
	"github.com/ferrymq/ferry/broker"
	"github.com/ferrymq/ferry/outbox"
	"github.com/ferrymq/ferry/worker"
)

func TestMuxRoutesByPatternInRegistrationOrder(t *testing.T) {
	t.Parallel()
	mux := ferry.NewMux()
	var got []string
	h := func(name string) worker.Handler {
		return func(_ context.Context, _ pgx.Tx, msg *broker.Message) error {
			got = append(got, name+":"+msg.Type)
			return nil
		}
	}
	require.NoError(t, mux.Handle("order.placed", h("exact")))
	require.NoError(t, mux.Handle("order.*", h("star")))
	require.NoError(t, mux.Handle("#.audit", h("hash")))
	require.Equal(t, []string{"order.placed", "order.*", "#.audit"}, mux.Patterns())

	for _, typ := range []string{"order.placed", "order.cancelled", "audit", "a.b.audit", "order.placed.audit"} {
		require.NoError(t, mux.HandleMessage(context.Background(), nil, &broker.Message{ID: "1", Type: typ}))
	}
	require.Equal(t, []string{"exact:order.placed", "star:order.cancelled", "hash:audit", "hash:a.b.audit", "hash:order.placed.audit"}, got)

	err := mux.HandleMessage(context.Background(), nil, &broker.Message{ID: "7", Type: "invoice.sent"})
	require.ErrorIs(t, err, ferry.ErrNoHandler)
	require.True(t, worker.IsPermanent(err), "no handler: dead-lettered at once, not retried")
	require.Contains(t, err.Error(), `"invoice.sent"`)
	require.Contains(t, err.Error(), "order.placed, order.*, #.audit")
}

func TestMuxRefusesBadRegistrations(t *testing.T) {
	t.Parallel()
	mux := ferry.NewMux()
	ok := func(context.Context, pgx.Tx, *broker.Message) error { return nil }
	require.NoError(t, mux.Handle("a.b", ok))
	for name, err := range map[string]error{
		"twice":        mux.Handle("a.b", ok),
		"bad pattern":  mux.Handle("a.b*", ok),
		"empty":        mux.Handle("", ok),
		"nil handler":  mux.Handle("c", nil),
		"nil typed":    ferry.Handle[orderPlaced](mux, "d", nil),
		"typed twice":  ferry.Handle(mux, "a.b", func(context.Context, pgx.Tx, *ferry.Job[orderPlaced]) error { return nil }),
		"typed bad pt": ferry.Handle(mux, "a..b", func(context.Context, pgx.Tx, *ferry.Job[orderPlaced]) error { return nil }),
	} {
		require.ErrorIs(t, err, ferry.ErrInvalidConfig, name)
	}
	require.Equal(t, []string{"a.b"}, mux.Patterns())
}

type signup struct {
	Email string `json:"email"`
}

func (s signup) Validate() error {
	if s.Email == "" {
		return errors.New("email is required")
	}
	return nil
}

type pointerValidated struct {
	N int `json:"n"`
}

func (p *pointerValidated) Validate() error {
	if p.N < 0 {
		return errors.New("n must not be negative")
	}
	return nil
}

func TestHandleDecodesAndValidates(t *testing.T) {
	t.Parallel()
	mux := ferry.NewMux()
	var got *ferry.Job[signup]
	require.NoError(t, ferry.Handle(mux, "user.signup", func(_ context.Context, _ pgx.Tx, job *ferry.Job[signup]) error {
		got = job
		return nil
	}))
	msg := &broker.Message{ID: "3", Type: "user.signup", Key: "k", Attempt: 2, Body: []byte(`{"email":"a@b.c","later_field":1}`)}
	require.NoError(t, mux.HandleMessage(context.Background(), nil, msg))
	require.Equal(t, signup{Email: "a@b.c"}, got.Args, "unknown fields are ignored")
	require.Equal(t, "3", got.ID)
	require.Equal(t, 2, got.Attempt)

	got = nil
	for name, body := range map[string]string{
		"not JSON":   `{`,
		"empty":      ``,
		"wrong type": `{"email":7}`,
	} {
		err := mux.HandleMessage(context.Background(), nil, &broker.Message{ID: "4", Type: "user.signup", Body: []byte(body)})
		require.ErrorIs(t, err, ferry.ErrUndecodable, name)
		require.NotErrorIs(t, err, ferry.ErrInvalidEvent, name)
		require.True(t, worker.IsPermanent(err), "%s: dead-lettered at once", name)
		require.Contains(t, err.Error(), "ferry_test.signup", name)
		require.Nil(t, got, "%s: the handler must not run", name)
	}

	// A body Validate refuses is an invalid event, not an undecodable body,
	// and the reason says so.
	err := mux.HandleMessage(context.Background(), nil, &broker.Message{ID: "5", Type: "user.signup", Body: []byte(`{"email":""}`)})
	require.ErrorIs(t, err, ferry.ErrInvalidEvent)
	require.NotErrorIs(t, err, ferry.ErrUndecodable)
	require.True(t, worker.IsPermanent(err), "dead-lettered at once")
	require.Equal(t, "ferry: invalid event: message 5 (type user.signup): ferry_test.signup refused by its Validate: email is required", err.Error())
	require.Nil(t, got, "the handler must not run")

	_, err = ferry.Decode[pointerValidated](&broker.Message{Body: []byte(`{"n":-1}`)})
	require.ErrorIs(t, err, ferry.ErrInvalidEvent, "Validate on *T is called too")
	v, err := ferry.Decode[pointerValidated](&broker.Message{Body: []byte(`{"n":5}`)})
	require.NoError(t, err)
	require.Equal(t, 5, v.N)
	_, err = ferry.Decode[signup](nil)
	require.ErrorIs(t, err, ferry.ErrUndecodable)
}

func TestNewEvent(t *testing.T) {
	t.Parallel()
	e, err := ferry.NewEvent("user.signup", signup{Email: "a@b.c"}, ferry.WithKey("u1"), ferry.WithHeader("tenant", "t"))
	require.NoError(t, err)
	require.Equal(t, outbox.Event{Type: "user.signup", Key: "u1", Body: []byte(`{"email":"a@b.c"}`),
		Headers: map[string]string{"tenant": "t"}}, e)

	_, err = ferry.NewEvent("x", make(chan int))
	require.ErrorIs(t, err, outbox.ErrInvalidEvent, "a value JSON cannot encode")
	_, err = ferry.NewEvent("x", 1, ferry.WithHeader("x-retry-count", "1"))
	require.ErrorIs(t, err, outbox.ErrInvalidEvent, "a reserved header")
	_, err = ferry.NewEvent("order.*", 1)
	require.ErrorIs(t, err, outbox.ErrInvalidEvent, "a pattern is not an event type")

	e, err = ferry.NewEvent("x", 1, ferry.DueIn(0))
	require.NoError(t, err)
	require.True(t, e.DueAt.IsZero(), "DueIn(0) is now")
}
