// Package promlock records the lock events of any backend as Prometheus
// metrics (client_golang).
//
// An Observer is both a lock.Observer, installed with WithObserver on a
// factory, and a prometheus.Collector, registered once:
//
//	obs := promlock.New()
//	prometheus.MustRegister(obs)
//	locks := redislock.NewFactory(rdb, redislock.WithObserver(obs))
//
// Metrics are labelled by backend, op and outcome only, which take few
// values; never by the lock name, which would make a series per tenant or
// job id.
package promlock

import (
	"cmp"
	"context"
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/ubgo/lock"
)

// Buckets are the bounds, in seconds, of the duration histograms: from a
// millisecond acquire to an hour-long hold.
var Buckets = []float64{.001, .005, .01, .05, .1, .5, 1, 5, 10, 30, 60, 300, 900, 3600}

// Observer records lock events. One Observer may serve many factories and
// backends; register it once.
type Observer struct {
	ops     *prometheus.CounterVec
	acquire *prometheus.HistogramVec
	wait    *prometheus.HistogramVec
	hold    *prometheus.HistogramVec
	held    *prometheus.GaugeVec
	lost    *prometheus.CounterVec
	class   func(name string) string // nil: no class label

	mu sync.Mutex
	// holding counts the locks held now, so that a lock's end is counted
	// once even when it is reported twice: redislock reports a Release that
	// could not reach Redis, then the loss of the same holder.
	holding map[holder]int
	early   map[holder]bool // lost before their Acquire's event came
}

type holder struct {
	backend, name string
	token         uint64
}

// An Option configures New.
type Option func(*options)

type options struct {
	namespace string
	class     func(name string) string
}

// WithNamespace prefixes every metric name with ns and an underscore
// (myapp_lock_held).
func WithNamespace(ns string) Option { return func(o *options) { o.namespace = ns } }

// WithClass labels the series that follow held locks — lock_held,
// lock_hold_duration_seconds, lock_lost_total — with class, class(name),
// so that a leader's lock or gocronlock's kept job lock, held for hours on
// purpose, is told from a stuck job's on the same backend. class must map
// names to a few values (a name's prefix, say): never return the name.
//
//	promlock.WithClass(func(name string) string {
//		if strings.HasPrefix(name, "gocron:") || strings.HasPrefix(name, "leader/") {
//			return "long-lived"
//		}
//		return "job"
//	})
func WithClass(class func(name string) string) Option {
	return func(o *options) { o.class = class }
}

// New returns an Observer with its metrics created but not registered.
func New(opts ...Option) *Observer {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	ns := o.namespace
	histogram := func(name, help string, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: name, Help: help, Buckets: Buckets}, labels)
	}
	// The series of held locks carry class when WithClass gives one.
	held := func(labels ...string) []string {
		if o.class != nil {
			labels = append(labels, "class")
		}
		return labels
	}
	return &Observer{
		class: o.class,
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "lock_operations_total",
			Help: "Lock operations (acquire, release, extend, lost) by outcome."}, []string{"backend", "op", "outcome"}),
		acquire: histogram("lock_acquire_duration_seconds", "Time an Acquire took, waiting included.", "backend", "outcome"),
		wait:    histogram("lock_wait_duration_seconds", "Time an Acquire waited for another holder, for those that waited.", "backend"),
		hold:    histogram("lock_hold_duration_seconds", "How long a lock was held, by how it ended (ok: released).", held("backend", "outcome")...),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "lock_held",
			Help: "Locks (or semaphore permits) held now."}, held("backend")),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "lock_lost_total",
			Help: "Locks lost while held, by why (expired, session, removed, max_hold, other), except to the factory's Close."}, held("backend", "reason")),
		holding: map[holder]int{},
		early:   map[holder]bool{},
	}
}

// Observe records e; it implements lock.Observer.
func (o *Observer) Observe(_ context.Context, e lock.Event) {
	o.ops.WithLabelValues(e.Backend, string(e.Op), string(e.Outcome)).Inc()
	switch e.Op {
	case lock.OpAcquire:
		o.acquire.WithLabelValues(e.Backend, string(e.Outcome)).Observe(e.Latency.Seconds())
		if e.Wait > 0 {
			o.wait.WithLabelValues(e.Backend).Observe(e.Wait.Seconds())
		}
		if e.Outcome == lock.OutcomeOK && o.acquired(holder{e.Backend, e.Name, e.Token}) {
			o.held.WithLabelValues(o.labels(e, e.Backend)...).Inc()
		}
	case lock.OpLost:
		// A lock lost to its factory's Close was given up by the program
		// (a shutdown): no cause for an alert.
		if !errors.Is(e.Err, lock.ErrClosed) {
			o.lost.WithLabelValues(o.labels(e, e.Backend, string(cmp.Or(e.Reason, lock.ReasonOf(e.Err))))...).Inc()
		}
		o.end(e)
	case lock.OpRelease:
		o.end(e)
	}
}

// acquired records a lock taken, and reports whether it is held: not if
// its end was reported first (a WithMaxHold or a loss that fired before
// the Acquire's own event).
func (o *Observer) acquired(k holder) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.early[k] {
		delete(o.early, k)
		return false
	}
	o.holding[k]++
	return true
}

// end records the end of a held lock, the first time it is reported.
func (o *Observer) end(e lock.Event) {
	k := holder{e.Backend, e.Name, e.Token}
	o.mu.Lock()
	n := o.holding[k]
	switch {
	case n > 1:
		o.holding[k] = n - 1
	case n == 1:
		delete(o.holding, k)
	case e.Op == lock.OpLost:
		// Perhaps ahead of its Acquire's event. Kept few: an entry
		// left by a loss reported after a failed release is dropped
		// with the rest when they pile up.
		if len(o.early) >= 1024 {
			clear(o.early)
		}
		o.early[k] = true
	}
	o.mu.Unlock()
	if n == 0 {
		return
	}
	o.held.WithLabelValues(o.labels(e, e.Backend)...).Dec()
	o.hold.WithLabelValues(o.labels(e, e.Backend, string(e.Outcome))...).Observe(e.Held.Seconds())
}

// labels returns values, and e's class when WithClass gave a classifier.
func (o *Observer) labels(e lock.Event, values ...string) []string {
	if o.class != nil {
		values = append(values, o.class(e.Name))
	}
	return values
}

func (o *Observer) collectors() []prometheus.Collector {
	return []prometheus.Collector{o.ops, o.acquire, o.wait, o.hold, o.held, o.lost}
}

// Describe sends the descriptors of the metrics; it implements
// prometheus.Collector.
func (o *Observer) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range o.collectors() {
		c.Describe(ch)
	}
}

// Collect sends the metrics; it implements prometheus.Collector.
func (o *Observer) Collect(ch chan<- prometheus.Metric) {
	for _, c := range o.collectors() {
		c.Collect(ch)
	}
}
