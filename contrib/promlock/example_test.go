package promlock_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/ubgo/lock"
	"github.com/ubgo/lock/contrib/promlock"
	"github.com/ubgo/lock/memlock"
)

// An Observer wired into a factory and registered; a program would serve
// the registry with promhttp.HandlerFor(reg, promhttp.HandlerOpts{}) (or
// use prometheus.MustRegister and promhttp.Handler()).
func Example() {
	obs := promlock.New(promlock.WithNamespace("myapp"))
	reg := prometheus.NewRegistry()
	reg.MustRegister(obs)
	locks := memlock.NewFactory(memlock.WithObserver(obs))

	ctx := context.Background()
	h, err := locks.Acquire(ctx, "nightly-report")
	if err != nil {
		panic(err)
	}
	_, err = locks.Acquire(ctx, "nightly-report") // a second instance finds it taken
	fmt.Println("second instance locked out:", errors.Is(err, lock.ErrLocked))
	h.Release()

	mfs, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, mf := range mfs {
		if mf.GetType() != dto.MetricType_HISTOGRAM { // durations differ run to run
			expfmt.MetricFamilyToText(os.Stdout, mf)
		}
	}
	// Output:
	// second instance locked out: true
	// # HELP myapp_lock_held Locks (or semaphore permits) held now.
	// # TYPE myapp_lock_held gauge
	// myapp_lock_held{backend="memlock"} 0
	// # HELP myapp_lock_operations_total Lock operations (acquire, release, extend, lost) by outcome.
	// # TYPE myapp_lock_operations_total counter
	// myapp_lock_operations_total{backend="memlock",op="acquire",outcome="locked"} 1
	// myapp_lock_operations_total{backend="memlock",op="acquire",outcome="ok"} 1
	// myapp_lock_operations_total{backend="memlock",op="release",outcome="ok"} 1
}
