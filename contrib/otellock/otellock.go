// Package otellock records the events of any lock backend as OpenTelemetry
// metrics and spans: install the Observer New returns with the backend's
// WithObserver option.
//
// Metrics carry only bounded attributes (lock.backend, lock.operation,
// lock.outcome); the lock name is unbounded and is never one of them. It
// goes on spans, and only with WithNameAttribute.
package otellock

import (
	"cmp"
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/ubgo/lock"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/ubgo/lock/contrib/otellock"

// The attribute keys.
const (
	BackendKey   = attribute.Key("lock.backend")
	OperationKey = attribute.Key("lock.operation")
	OutcomeKey   = attribute.Key("lock.outcome")
	TokenKey     = attribute.Key("lock.token")  // spans only
	NameKey      = attribute.Key("lock.name")   // spans only, with WithNameAttribute
	ReasonKey    = attribute.Key("lock.reason") // lock.lost: why (lock.ReasonOf)
	ClassKey     = attribute.Key("lock.class")  // held locks' instruments, with WithClass
)

// An Option configures New.
type Option func(*config)

type config struct {
	mp    metric.MeterProvider
	tp    trace.TracerProvider
	name  bool
	class func(name string) string
}

// WithMeterProvider sets the meter provider; otel.GetMeterProvider() by default.
func WithMeterProvider(mp metric.MeterProvider) Option { return func(c *config) { c.mp = mp } }

// WithTracerProvider sets the tracer provider; otel.GetTracerProvider() by default.
func WithTracerProvider(tp trace.TracerProvider) Option { return func(c *config) { c.tp = tp } }

// WithNameAttribute puts the lock name on spans as lock.name. It is off by
// default: names can carry tenant or job ids.
func WithNameAttribute() Option { return func(c *config) { c.name = true } }

// WithClass puts lock.class, class(name), on the instruments that follow
// held locks (lock.held, lock.hold.duration, lock.lost), so that a
// leader's lock or gocronlock's kept job lock, held for hours on purpose,
// is told from a stuck job's on the same backend. class must map names to
// a few values (a name's prefix, say): never return the name.
func WithClass(class func(name string) string) Option {
	return func(c *config) { c.class = class }
}

// Observer is a lock.Observer that records metrics and spans. It is safe
// for concurrent use; share one between factories.
type Observer struct {
	tracer                 trace.Tracer
	name                   bool
	class                  func(name string) string // nil: no lock.class
	ops, lost              metric.Int64Counter
	held                   metric.Int64UpDownCounter
	acquire, wait, holding metric.Float64Histogram

	sets sync.Map // setKey -> attribute.Set, built once per combination

	mu      sync.Mutex
	holders map[holderKey]int  // acquired and neither released nor lost yet
	early   map[holderKey]bool // lost before their Acquire's event came
}

type setKey struct {
	backend string
	op      lock.Op
	outcome lock.Outcome
	class   string
	reason  lock.Reason
}

type holderKey struct {
	backend, name string
	token         uint64
}

// New returns an Observer whose instruments are created once, here.
// Instrument errors go to otel.Handle; the instruments still work as no-ops.
func New(opts ...Option) *Observer {
	c := config{}
	for _, opt := range opts {
		opt(&c)
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	m := c.mp.Meter(ScopeName)
	o := &Observer{tracer: c.tp.Tracer(ScopeName), name: c.name, class: c.class, holders: map[holderKey]int{}, early: map[holderKey]bool{}}
	var errs [6]error
	o.ops, errs[0] = m.Int64Counter("lock.operations", metric.WithUnit("{operation}"),
		metric.WithDescription("Lock operations (acquire, release, extend, lost) by outcome."))
	o.lost, errs[1] = m.Int64Counter("lock.lost", metric.WithUnit("{lock}"),
		metric.WithDescription("Locks lost while held, not counting those lost to the factory's Close."))
	o.held, errs[2] = m.Int64UpDownCounter("lock.held", metric.WithUnit("{lock}"),
		metric.WithDescription("Locks held now."))
	o.acquire, errs[3] = m.Float64Histogram("lock.acquire.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of Acquire calls, waiting included."),
		metric.WithExplicitBucketBoundaries(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
	o.wait, errs[4] = m.Float64Histogram("lock.wait.duration", metric.WithUnit("s"),
		metric.WithDescription("Time acquires that waited spent queued behind another holder."),
		metric.WithExplicitBucketBoundaries(0.001, 0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600))
	o.holding, errs[5] = m.Float64Histogram("lock.hold.duration", metric.WithUnit("s"),
		metric.WithDescription("How long locks were held, at release or loss."),
		metric.WithExplicitBucketBoundaries(0.01, 0.1, 1, 10, 60, 300, 900, 3600, 4*3600, 24*3600))
	for _, err := range errs {
		if err != nil {
			otel.Handle(err)
		}
	}
	return o
}

// Observe records e. It implements lock.Observer.
func (o *Observer) Observe(ctx context.Context, e lock.Event) {
	all := metric.WithAttributeSet(o.set(setKey{backend: e.Backend, op: e.Op, outcome: e.Outcome}))
	class := ""
	if o.class != nil {
		class = o.class(e.Name)
	}
	byBackend := metric.WithAttributeSet(o.set(setKey{backend: e.Backend, class: class}))
	o.ops.Add(ctx, 1, all)
	k := holderKey{e.Backend, e.Name, e.Token}
	switch e.Op {
	case lock.OpAcquire:
		o.acquire.Record(ctx, e.Latency.Seconds(), all)
		if e.Outcome == lock.OutcomeOK && o.acquired(k) {
			o.held.Add(ctx, 1, byBackend)
		}
		if e.Wait > 0 {
			o.wait.Record(ctx, e.Wait.Seconds(), all)
			o.span(ctx, e)
		}
	case lock.OpRelease, lock.OpLost:
		if e.Op == lock.OpLost && !errors.Is(e.Err, lock.ErrClosed) {
			why := cmp.Or(e.Reason, lock.ReasonOf(e.Err))
			o.lost.Add(ctx, 1, metric.WithAttributeSet(o.set(setKey{backend: e.Backend, class: class, reason: why})))
		}
		if o.ended(k, e.Op) {
			o.held.Add(ctx, -1, byBackend)
			o.holding.Record(ctx, e.Held.Seconds(), metric.WithAttributeSet(o.set(setKey{backend: e.Backend, op: e.Op, outcome: e.Outcome, class: class})))
		}
	}
}

// acquired records a lock taken, and reports whether it is held: not if
// its loss was reported first (a WithMaxHold or a loss that fired before
// the Acquire's own event).
func (o *Observer) acquired(k holderKey) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.early[k] {
		delete(o.early, k)
		return false
	}
	o.holders[k]++
	return true
}

// ended reports whether k was held and forgets it. A holder ends once,
// by its first release or loss event: after a loss no backend reports a
// release, but redislock reports a release whose call failed and then the
// loss or the retried release, and memlock reports the release of a permit
// granted to a waiter that had given up, whose acquire failed.
func (o *Observer) ended(k holderKey, op lock.Op) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := o.holders[k]
	switch {
	case n == 0 && op == lock.OpLost:
		// Perhaps ahead of its Acquire's event (see acquired). Kept few:
		// an entry left by a loss reported after a failed release is
		// dropped with the rest when they pile up.
		if len(o.early) >= 1024 {
			clear(o.early)
		}
		o.early[k] = true
		return false
	case n == 0:
		return false
	case n == 1:
		delete(o.holders, k)
	default:
		o.holders[k] = n - 1 // two factories, one name, the same token
	}
	return true
}

// set returns the attribute set of one combination, built on first use:
// every value comes from a small closed set.
func (o *Observer) set(k setKey) attribute.Set {
	if s, ok := o.sets.Load(k); ok {
		return s.(attribute.Set)
	}
	kv := []attribute.KeyValue{BackendKey.String(k.backend)}
	if k.op != "" {
		kv = append(kv, OperationKey.String(string(k.op)), OutcomeKey.String(string(k.outcome)))
	}
	if o.class != nil {
		kv = append(kv, ClassKey.String(k.class))
	}
	if k.reason != "" {
		kv = append(kv, ReasonKey.String(string(k.reason)))
	}
	s, _ := o.sets.LoadOrStore(k, attribute.NewSet(kv...))
	return s.(attribute.Set)
}

// span records an acquire that waited: it ended now and began e.Latency ago.
func (o *Observer) span(ctx context.Context, e lock.Event) {
	end := time.Now()
	kv := []attribute.KeyValue{BackendKey.String(e.Backend), OperationKey.String(string(e.Op)), OutcomeKey.String(string(e.Outcome))}
	if e.Token != 0 {
		kv = append(kv, TokenKey.Int64(int64(e.Token)))
	}
	if o.name {
		kv = append(kv, NameKey.String(e.Name))
	}
	_, s := o.tracer.Start(ctx, "lock.acquire", trace.WithTimestamp(end.Add(-e.Latency)), trace.WithAttributes(kv...))
	if e.Err != nil {
		s.SetStatus(codes.Error, e.Err.Error())
	}
	s.End(trace.WithTimestamp(end))
}
