package otellock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/contrib/otellock"
	"github.com/ubgo/lock/internal/testenv"
	"github.com/ubgo/lock/memlock"
)

// harness is an Observer wired to an in-memory reader and span recorder.
type harness struct {
	t      *testing.T
	obs    *otellock.Observer
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
}

func newHarness(t *testing.T, opts ...otellock.Option) *harness {
	h := &harness{t: t, reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(h.reader))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(h.spans))
	t.Cleanup(func() { mp.Shutdown(context.Background()); tp.Shutdown(context.Background()) })
	h.obs = otellock.New(append([]otellock.Option{otellock.WithMeterProvider(mp), otellock.WithTracerProvider(tp)}, opts...)...)
	return h
}

// point is one data point: a sum's value, or a histogram's count and sum.
type point struct {
	Value, Count int64
	Sum          float64
}

// collect returns the named metric's points keyed by their attributes,
// written "backend/op/outcome" (or "backend" for lock.held and lock.lost).
func (h *harness) collect(name string) map[string]point {
	h.t.Helper()
	var rm metricdata.ResourceMetrics
	if err := h.reader.Collect(context.Background(), &rm); err != nil {
		h.t.Fatal(err)
	}
	got := map[string]point{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					got[key(dp.Attributes)] = point{Value: dp.Value}
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					got[key(dp.Attributes)] = point{Count: int64(dp.Count), Sum: dp.Sum}
				}
			default:
				h.t.Fatalf("%s: unexpected data %T", name, m.Data)
			}
		}
	}
	return got
}

func key(s attribute.Set) string {
	k, _ := s.Value(otellock.BackendKey)
	out := k.AsString()
	if op, ok := s.Value(otellock.OperationKey); ok {
		oc, _ := s.Value(otellock.OutcomeKey)
		out += "/" + op.AsString() + "/" + oc.AsString()
	}
	for _, extra := range []attribute.Key{otellock.ClassKey, otellock.ReasonKey} {
		if v, ok := s.Value(extra); ok {
			out += " " + string(extra) + "=" + v.AsString()
		}
	}
	return out
}

// want compares a metric's points with want exactly.
func (h *harness) want(name string, want map[string]point) {
	h.t.Helper()
	got := h.collect(name)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		h.t.Errorf("%s:\n got %v\nwant %v", name, got, want)
	}
}

// counts reduces histogram points to their counts, for durations measured
// on the real clock.
func counts(p map[string]point) map[string]point {
	for k, v := range p {
		p[k] = point{Count: v.Count}
	}
	return p
}

// waitAcquire starts a waiting Acquire of name and returns once it has queued.
func waitAcquire(ctx context.Context, t *testing.T, f *memlock.Factory, name string) <-chan *memlock.Holder {
	t.Helper()
	ch := make(chan *memlock.Holder, 1)
	before := f.Waiting(name)
	go func() {
		h, _ := f.Acquire(ctx, name, memlock.WithWait())
		ch <- h
	}()
	testenv.Eventually(t, 10*time.Second, "the waiter to queue", func() bool { return f.Waiting(name) > before })
	return ch
}

func TestMetrics(t *testing.T) {
	h := newHarness(t)
	clock := memlock.NewManualClock(time.Now())
	f := memlock.NewFactory(memlock.WithObserver(h.obs), memlock.WithClock(clock))
	ctx := context.Background()

	first, err := f.Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Acquire(ctx, "job"); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("second acquire: %v", err)
	}
	h.want("lock.held", map[string]point{"memlock": {Value: 1}})

	granted := waitAcquire(context.Background(), t, f, "job")
	clock.Advance(2 * time.Second)
	first.Release()
	second := <-granted
	if second == nil {
		t.Fatal("the waiter got no lock")
	}
	h.want("lock.held", map[string]point{"memlock": {Value: 1}})
	if err := second.Extend(ctx); err != nil {
		t.Fatal(err)
	}

	clock.Advance(5 * time.Second)
	if n := f.ForceLoss("job"); n != 1 {
		t.Fatalf("ForceLoss: %d holders", n)
	}
	// After the loss: Release reports nothing, Extend reports a lost extend.
	if err := second.Release(); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("release after loss: %v", err)
	}
	if err := second.Extend(ctx); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("extend after loss: %v", err)
	}

	h.want("lock.operations", map[string]point{
		"memlock/acquire/ok":     {Value: 2},
		"memlock/acquire/locked": {Value: 1},
		"memlock/release/ok":     {Value: 1},
		"memlock/extend/ok":      {Value: 1},
		"memlock/extend/lost":    {Value: 1},
		"memlock/lost/lost":      {Value: 1},
	})
	h.want("lock.held", map[string]point{"memlock": {Value: 0}})
	h.want("lock.lost", map[string]point{"memlock lock.reason=removed": {Value: 1}})
	// Held is measured on the factory's clock: 2 s, then 5 s.
	h.want("lock.hold.duration", map[string]point{
		"memlock/release/ok": {Count: 1, Sum: 2},
		"memlock/lost/lost":  {Count: 1, Sum: 5},
	})
	if got, want := counts(h.collect("lock.acquire.duration")), map[string]point{
		"memlock/acquire/ok":     {Count: 2},
		"memlock/acquire/locked": {Count: 1},
	}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("lock.acquire.duration: got %v, want %v", got, want)
	}
	wait := h.collect("lock.wait.duration")
	if p := wait["memlock/acquire/ok"]; len(wait) != 1 || p.Count != 1 || p.Sum <= 0 {
		t.Errorf("lock.wait.duration: got %v, want one positive wait", wait)
	}
}

// A lock lost to its factory's Close is no longer held, but the program
// asked for it: it is not counted in lock.lost.
func TestClose(t *testing.T) {
	h := newHarness(t)
	f := memlock.NewFactory(memlock.WithObserver(h.obs))
	for _, name := range []string{"a", "b"} {
		if _, err := f.Acquire(context.Background(), name); err != nil {
			t.Fatal(err)
		}
	}
	h.want("lock.held", map[string]point{"memlock": {Value: 2}})
	f.Close()
	h.want("lock.held", map[string]point{"memlock": {Value: 0}})
	h.want("lock.lost", map[string]point{})
	h.want("lock.operations", map[string]point{"memlock/acquire/ok": {Value: 2}, "memlock/lost/lost": {Value: 2}})
}

// Backends report some holders' ends twice, or the end of a holder whose
// acquire failed; lock.held counts every holder once.
func TestHeldCountsEachHolderOnce(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	ev := func(op lock.Op, outcome lock.Outcome, name string, token uint64) {
		h.obs.Observe(ctx, lock.Event{Backend: "redislock", Op: op, Outcome: outcome, Name: name, Token: token, Held: time.Second})
	}
	// redislock: a release whose script failed, then the loss.
	ev(lock.OpAcquire, lock.OutcomeOK, "a", 7)
	ev(lock.OpRelease, lock.OutcomeError, "a", 7)
	ev(lock.OpLost, lock.OutcomeLost, "a", 7)
	h.want("lock.held", map[string]point{"redislock": {Value: 0}})
	// memlock: a permit granted to a waiter that had given up is released.
	ev(lock.OpRelease, lock.OutcomeOK, "b", 3)
	h.want("lock.held", map[string]point{"redislock": {Value: 0}})
	// Two factories (two servers) hand out the same name and token.
	ev(lock.OpAcquire, lock.OutcomeOK, "c", 1)
	ev(lock.OpAcquire, lock.OutcomeOK, "c", 1)
	ev(lock.OpRelease, lock.OutcomeOK, "c", 1)
	h.want("lock.held", map[string]point{"redislock": {Value: 1}})
	ev(lock.OpLost, lock.OutcomeLost, "c", 1)
	h.want("lock.held", map[string]point{"redislock": {Value: 0}})
	h.want("lock.lost", map[string]point{"redislock": {Value: 2}})
	h.want("lock.hold.duration", map[string]point{
		"redislock/release/error": {Count: 1, Sum: 1},
		"redislock/release/ok":    {Count: 1, Sum: 1},
		"redislock/lost/lost":     {Count: 1, Sum: 1},
	})
}

func TestSpans(t *testing.T) {
	for _, withName := range []bool{false, true} {
		t.Run(fmt.Sprintf("name=%v", withName), func(t *testing.T) {
			var opts []otellock.Option
			if withName {
				opts = append(opts, otellock.WithNameAttribute())
			}
			h := newHarness(t, opts...)
			f := memlock.NewFactory(memlock.WithObserver(h.obs))
			first, err := f.Acquire(context.Background(), "job")
			if err != nil {
				t.Fatal(err)
			}
			if got := len(h.spans.Ended()); got != 0 {
				t.Fatalf("an acquire that did not wait made %d spans", got)
			}

			granted := waitAcquire(context.Background(), t, f, "job")
			first.Release()
			second := <-granted
			// A wait that gives up, cancelled once queued.
			ctx, cancel := context.WithCancel(context.Background())
			gaveUp := waitAcquire(ctx, t, f, "job")
			cancel()
			if h := <-gaveUp; h != nil {
				t.Fatal("acquired a held lock")
			}

			spans := h.spans.Ended()
			if len(spans) != 2 {
				t.Fatalf("got %d spans, want 2", len(spans))
			}
			want := []map[attribute.Key]any{
				{otellock.BackendKey: "memlock", otellock.OperationKey: "acquire", otellock.OutcomeKey: "ok", otellock.TokenKey: int64(second.Token())},
				{otellock.BackendKey: "memlock", otellock.OperationKey: "acquire", otellock.OutcomeKey: "locked"},
			}
			for i, s := range spans {
				if withName {
					want[i][otellock.NameKey] = "job"
				}
				got := map[attribute.Key]any{}
				for _, kv := range s.Attributes() {
					got[kv.Key] = kv.Value.AsInterface()
				}
				if s.Name() != "lock.acquire" || fmt.Sprint(got) != fmt.Sprint(want[i]) {
					t.Errorf("span %d: %s %v, want lock.acquire %v", i, s.Name(), got, want[i])
				}
				if !s.EndTime().After(s.StartTime()) {
					t.Errorf("span %d: starts %v, ends %v", i, s.StartTime(), s.EndTime())
				}
			}
			if st := spans[0].Status(); st.Code != codes.Unset {
				t.Errorf("won wait: status %v", st)
			}
			if st := spans[1].Status(); st.Code != codes.Error || st.Description == "" {
				t.Errorf("failed wait: status %v, want an error", st)
			}
		})
	}
}

// WithClass puts lock.class on held locks' instruments; a loss says why.
func TestClassAndReason(t *testing.T) {
	h := newHarness(t, otellock.WithClass(func(name string) string {
		if strings.HasPrefix(name, "leader/") {
			return "long-lived"
		}
		return "job"
	}))
	f := memlock.NewFactory(memlock.WithObserver(h.obs))
	defer f.Close()
	ctx := context.Background()
	if _, err := f.Acquire(ctx, "leader/api"); err != nil {
		t.Fatal(err)
	}
	ex, err := f.Acquire(ctx, "export", memlock.WithMaxHold(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	<-ex.Done() // closed before the loss is reported
	testenv.Eventually(t, 10*time.Second, "the loss reported", func() bool { return len(h.collect("lock.lost")) > 0 })
	h.want("lock.held", map[string]point{"memlock lock.class=job": {Value: 0}, "memlock lock.class=long-lived": {Value: 1}})
	h.want("lock.lost", map[string]point{"memlock lock.class=job lock.reason=max_hold": {Value: 1}})
}
