package tests

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ubgo/lock/contrib/otellock"
	"github.com/ubgo/lock/contrib/promlock"
	"github.com/ubgo/lock/memlock"
)

// promlock and otellock on one factory both see every operation: observers
// add up, in the order given.
func TestPromAndOtelOnOneFactory(t *testing.T) {
	prom := promlock.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(prom)

	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	otel := otellock.New(otellock.WithMeterProvider(mp))

	f := memlock.NewFactory(memlock.WithObserver(prom), memlock.WithObserver(otel))
	defer f.Close()
	h, err := f.Acquire(context.Background(), "job")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}

	want := `
# HELP lock_operations_total Lock operations (acquire, release, extend, lost) by outcome.
# TYPE lock_operations_total counter
lock_operations_total{backend="memlock",op="acquire",outcome="ok"} 1
lock_operations_total{backend="memlock",op="release",outcome="ok"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "lock_operations_total"); err != nil {
		t.Errorf("promlock: %v", err)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var ops int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "lock.operations" {
				for _, p := range sum.DataPoints {
					ops += p.Value
				}
			}
		}
	}
	if ops != 2 {
		t.Errorf("otellock: %d operations; want 2", ops)
	}
}
