package otellock_test

import (
	"context"
	"fmt"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ubgo/lock/contrib/otellock"
	"github.com/ubgo/lock/memlock"
)

func ExampleNew() {
	// A program passes its own providers (an OTLP or Prometheus exporter
	// behind them), or none to use otel.GetMeterProvider() and
	// otel.GetTracerProvider(). Here a manual reader shows what is recorded.
	reader := sdkmetric.NewManualReader()
	obs := otellock.New(otellock.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	locks := memlock.NewFactory(memlock.WithObserver(obs))

	ctx := context.Background()
	h, _ := locks.Acquire(ctx, "nightly-import")
	locks.Acquire(ctx, "nightly-import") // contention: ErrLocked
	h.Release()

	var rm metricdata.ResourceMetrics
	reader.Collect(ctx, &rm)
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "lock.operations" {
			for _, dp := range sum.DataPoints {
				op, _ := dp.Attributes.Value(otellock.OperationKey)
				outcome, _ := dp.Attributes.Value(otellock.OutcomeKey)
				fmt.Println(m.Name, op.AsString(), outcome.AsString(), dp.Value)
			}
		}
	}
	// Unordered output:
	// lock.operations acquire ok 1
	// lock.operations acquire locked 1
	// lock.operations release ok 1
}
