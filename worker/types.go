package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferrymq/ferry/broker"
)

// TypeOptions are the settings of one event type (one pattern of a
// Router) that take the place of the worker's own. The zero value of each
// field means the worker's setting. ferry.Handle and ferry.Mux.Handle set
// them with ferry.WithMaxAttempts, ferry.WithRetryDelays,
// ferry.WithTimeout, ferry.WithConcurrency and ferry.WithRateLimit.
type TypeOptions struct {
	// MaxAttempts is the number of attempts, the first included, after
	// which a message of the type goes to the DLQ (as
	// BackoffPolicy.MaxAttempts). 0: the worker's policy's.
	MaxAttempts int
	// RetryDelays is the type's backoff list (the rule of
	// BackoffPolicy.Delays); each must be positive, and on a broker without
	// Capabilities.NativeDelay each must be one of the queue's declared
	// retry levels (broker.Queue.RetryDelays), which New checks. Nil: the
	// worker's policy's.
	RetryDelays []time.Duration
	// Timeout bounds each attempt of a message of the type, as
	// Config.HandlerTimeout does for the worker. 0: Config.HandlerTimeout.
	Timeout time.Duration
	// Concurrency, when set, bounds the messages of the type handled at
	// once across every worker sharing the database (ConcurrencyLimit).
	// Only with Config.BatchSize 1. The worker does not modify it.
	Concurrency *ConcurrencyLimit
	// Rate, when set, bounds the messages of the type started per second
	// across every worker sharing the database (RateLimit). Only with
	// Config.BatchSize 1. The worker does not modify it.
	Rate *RateLimit
}

// IsZero reports whether o sets nothing (every field the worker's).
func (o TypeOptions) IsZero() bool {
	return o.MaxAttempts == 0 && o.RetryDelays == nil && o.Timeout == 0 && o.Concurrency == nil && o.Rate == nil
}

// Validate returns an error naming the first invalid field, or nil.
func (o TypeOptions) Validate() error {
	if o.MaxAttempts < 0 {
		return fmt.Errorf("worker: TypeOptions.MaxAttempts %d: must not be negative", o.MaxAttempts)
	}
	if o.RetryDelays != nil && len(o.RetryDelays) == 0 {
		return errors.New("worker: TypeOptions.RetryDelays: empty (nil means the worker's delays)")
	}
	for i, d := range o.RetryDelays {
		if d <= 0 {
			return fmt.Errorf("worker: TypeOptions.RetryDelays[%d] %v: must be positive", i, d)
		}
	}
	if o.Timeout < 0 {
		return fmt.Errorf("worker: TypeOptions.Timeout %v: must not be negative", o.Timeout)
	}
	if o.Concurrency != nil {
		if err := o.Concurrency.Validate(); err != nil {
			return fmt.Errorf("worker: TypeOptions.Concurrency: %w", err)
		}
	}
	if o.Rate != nil {
		if err := o.Rate.Validate(); err != nil {
			return fmt.Errorf("worker: TypeOptions.Rate: %w", err)
		}
	}
	return nil
}

// Route is one pattern of a Router and the options registered with it.
type Route struct {
	// Pattern is a routing-key pattern (broker.MatchRoutingKey).
	Pattern string
	// Options are the pattern's settings; zero fields are the worker's.
	Options TypeOptions
}

// Router is a Handler serving several event types, each with options of
// its own; *ferry.Mux implements it. Set it as Config.Router (instead of
// Config.Handler) and the worker applies each message's options: the
// retry policy of its type decides after a failed attempt, and its
// timeout bounds the attempt. New and Run check every Route's options
// against the broker's Capabilities, like the worker's own settings.
type Router interface {
	// HandleMessage handles msg; see Handler. The worker calls it with a
	// ctx for which RouterFrom returns this Router.
	HandleMessage(ctx context.Context, tx pgx.Tx, msg *broker.Message) error
	// Route returns the route that handles eventType, false when none
	// does (the worker then uses its own settings). It must be safe for
	// concurrent use and fast: the worker calls it for every message.
	Route(eventType string) (Route, bool)
	// Routes returns every route, for the start-up checks.
	Routes() []Route
}

// routerKey is the ctx key of the Router the worker calls.
type routerKey struct{}

// RouterFrom returns the Router whose TypeOptions the worker applies to
// the message it handles with ctx, nil when the handler was not called as
// a worker's Config.Router. ferry.Mux uses it to refuse to run a handler
// whose options no worker applies (set as Config.Handler instead).
func RouterFrom(ctx context.Context) Router {
	r, _ := ctx.Value(routerKey{}).(Router)
	return r
}

// typeSettings are the settings a message of one route is handled with.
type typeSettings struct {
	policy  RetryPolicy
	timeout time.Duration
	flow    *flowLimits // the route's concurrency and rate limits; nil: none
	err     error       // why the route's options were refused; the attempt fails with it
}

// typeConfig is the Config a route's messages effectively run with: the
// worker's, with the route's policy and timeout.
type typeConfig struct {
	route Route
	cfg   Config
}

// routeConfig returns the Config of the worker as route r's messages see
// it: Policy is a BackoffPolicy made of r's MaxAttempts and RetryDelays,
// each falling back to the worker's policy's (its MaxAttempts and Delays
// when a BackoffPolicy, what it reports through AttemptLimit and
// DelayLister otherwise, else DefaultMaxAttempts and the queue's retry
// levels); HandlerTimeout is r's Timeout or the worker's. A route that
// sets neither MaxAttempts nor RetryDelays keeps the worker's policy as
// it is.
func routeConfig(cfg Config, r Route) Config {
	o := r.Options
	if o.Timeout > 0 {
		cfg.HandlerTimeout = o.Timeout
	}
	if o.MaxAttempts == 0 && o.RetryDelays == nil {
		return cfg
	}
	p := BackoffPolicy{MaxAttempts: o.MaxAttempts, Delays: slices.Clone(o.RetryDelays)}
	if p.MaxAttempts == 0 {
		switch base := cfg.Policy.(type) {
		case BackoffPolicy:
			p.MaxAttempts = base.maxAttempts()
		case interface{ AttemptLimit() int }:
			p.MaxAttempts = base.AttemptLimit()
		default:
			p.MaxAttempts = DefaultMaxAttempts
		}
	}
	if p.Delays == nil {
		if dl, ok := cfg.Policy.(DelayLister); ok {
			p.Delays = slices.Clone(dl.RetryDelays())
		} else if q, ok := cfg.Topology.Queue(cfg.Queue); ok {
			p.Delays = slices.Clone(q.Delays())
		}
	}
	cfg.Policy = p
	return cfg
}

// typeConfigs returns the effective Config of every route of the
// worker's Router (none without one). Every check of the worker's own
// settings must run on each of them too (through checkTypes): New and Run
// run checkTypeOptions on them; a check of the settings against limits
// the broker reports at Run belongs there as well, called with each
// route's Config as with the worker's.
func (w *Worker) typeConfigs() []typeConfig {
	if w.cfg.Router == nil {
		return nil
	}
	routes := w.cfg.Router.Routes()
	out := make([]typeConfig, 0, len(routes))
	for _, r := range routes {
		out = append(out, typeConfig{route: r, cfg: routeConfig(w.cfg, r)})
	}
	return out
}

// checkTypes runs check on the effective Config of every route and
// returns the first error, naming the route's pattern.
func (w *Worker) checkTypes(check func(Route, Config) error) error {
	for _, tc := range w.typeConfigs() {
		if err := check(tc.route, tc.cfg); err != nil {
			return fmt.Errorf("worker: Config.Router: pattern %q: %w", tc.route.Pattern, err)
		}
	}
	return nil
}

// checkTypeOptions checks route r's options, with cfg the Config its
// messages run with (routeConfig), against the broker's capabilities:
// the options are valid; each of r's own RetryDelays is within
// caps.MaxDelay (broker.Capabilities.Check); and, on a broker without
// NativeDelay, each is one of the queue's declared retry levels, since a
// delay between them would wait for the next level up and one beyond the
// longest would wait only that long (broker.Delivery.Retry). The error
// wraps ErrInvalidConfig or broker.ErrUnsupported.
func checkTypeOptions(r Route, cfg Config, caps broker.Capabilities) error {
	if err := r.Options.Validate(); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	if (r.Options.Concurrency != nil || r.Options.Rate != nil) && cfg.BatchSize > 1 {
		return fmt.Errorf("%w: concurrency and rate limits need Config.BatchSize 1 (it is %d): a slot is held for one message's transaction", ErrInvalidConfig, cfg.BatchSize)
	}
	if v, ok := cfg.Policy.(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidConfig, err)
		}
	}
	own := r.Options.RetryDelays
	if len(own) == 0 {
		return nil
	}
	if err := caps.Check(broker.Requirements{RetryDelays: own}); err != nil {
		return err
	}
	if caps.NativeDelay {
		return nil
	}
	q, ok := cfg.Topology.Queue(cfg.Queue)
	if !ok {
		return fmt.Errorf("%w: retry delays %v: %s has no native delays, only the retry levels declared for queue %s, and the worker cannot check them without Config.Topology",
			broker.ErrUnsupported, own, caps.Name, cfg.Queue)
	}
	levels := q.Delays()
	for _, d := range own {
		if !slices.Contains(levels, d) {
			return fmt.Errorf("%w: retry delay %v: %s has no native delays and queue %s declares only the retry levels %v (broker.Queue.RetryDelays), so this delay would not be kept; use delays from those levels or declare this one",
				broker.ErrUnsupported, d, caps.Name, cfg.Queue, levels)
		}
	}
	return nil
}

// typeCache holds the settings of each route seen, by pattern.
type typeCache struct {
	mu sync.RWMutex
	m  map[string]*typeSettings
}

// buildTypes checks every route's options and caches their settings; it
// returns the first refusal.
func (w *Worker) buildTypes() error {
	if w.cfg.Router == nil {
		return nil
	}
	m := map[string]*typeSettings{}
	err := w.checkTypes(func(r Route, c Config) error {
		if err := checkTypeOptions(r, c, w.caps); err != nil {
			return err
		}
		m[r.Pattern] = &typeSettings{policy: c.Policy, timeout: c.HandlerTimeout, flow: newFlowLimits(w.cfg.Consumer, r.Pattern, r.Options)}
		return nil
	})
	if err != nil {
		return err
	}
	w.types.mu.Lock()
	w.types.m = m
	w.types.mu.Unlock()
	return nil
}

// settingsFor returns the settings msg is handled with: its route's, or
// the worker's when there is no Router or no route for its type. A route
// registered after Run started is checked when its first message
// arrives; options refused then fail that message's attempts with the
// reason.
func (w *Worker) settingsFor(msg *broker.Message) *typeSettings {
	if w.cfg.Router == nil {
		return &w.base
	}
	r, ok := w.cfg.Router.Route(msg.Type)
	if !ok {
		return &w.base
	}
	w.types.mu.RLock()
	s, ok := w.types.m[r.Pattern]
	w.types.mu.RUnlock()
	if ok {
		return s
	}
	c := routeConfig(w.cfg, r)
	s = &typeSettings{policy: c.Policy, timeout: c.HandlerTimeout, flow: newFlowLimits(w.cfg.Consumer, r.Pattern, r.Options)}
	if err := checkTypeOptions(r, c, w.caps); err != nil {
		s.policy, s.flow = w.policy, nil
		s.err = fmt.Errorf("worker: Config.Router: pattern %q registered after the worker started: %w", r.Pattern, err)
		w.log.Error("worker: options of a route registered after the start refused; its messages fail", "pattern", r.Pattern, "err", err)
	}
	w.types.mu.Lock()
	if w.types.m == nil {
		w.types.m = map[string]*typeSettings{}
	}
	w.types.m[r.Pattern] = s
	w.types.mu.Unlock()
	return s
}
