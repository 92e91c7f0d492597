// Package bench puts every lock backend of the family beside its floor
// (the least its service or the kernel can do) and beside the libraries
// users would otherwise pick, in one process and one run.
//
// Cases are interleaved: every round runs each case in turn (in a rotated
// order), and the report shows the median over rounds of each round's
// figures, so that noise on the machine hits every case alike. Nothing here
// passes or fails on absolute time; the report states ratios.
//
// The command is cmd/bench (make bench); TestShort runs every case for a
// handful of iterations so that the benchmark cannot rot. docs/benchmarks.md
// holds the method and a recent run.
package bench

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"runtime/metrics"
	"time"
)

// Config sizes a run.
type Config struct {
	Runs     int            // runs of the uncontended cases; targets are decided on their median
	Rounds   int            // interleaved rounds of the uncontended cases, per run
	Batch    time.Duration  // time per uncontended case per round and condition
	MinOps   int            // at least this many operations per batch
	MaxOps   int            // at most this many operations per batch
	Warmup   int            // untimed operations per case before the first round
	Waiters  []int          // contenders on one name: the first for every contended and semaphore case, the others (crowds) for the network backends' mutex cases
	Permits  int            // semaphore size for the semaphore cases
	Contend  time.Duration  // time per contended case per round and condition
	CRounds  int            // rounds of the contended and semaphore cases
	Held     int            // locks held for the renewal and connection cases
	RRounds  int            // rounds of the renewal cases
	PeerPoll time.Duration  // retry interval of the peers that poll while waiting
	PgCount  bool           // count the Postgres cases' statements (two more passes of each, see pgCount)
	NoBusy   bool           // skip the busy condition
	Local    bool           // dial no service: only the memory and file cases run (go test -short)
	Only     *regexp.Regexp // run only the cases whose "section/id" matches (uncontended/redis/PING, renewal/etcd/etcdlock, ...); nil: all
	Log      io.Writer      // progress; nil: none
}

// want reports whether the case id of section runs.
func (c Config) want(section, id string) bool {
	return c.Only == nil || c.Only.MatchString(section+"/"+id)
}

// waiters is the first number of contenders: the one every contended
// case runs with.
func (c Config) waiters() int {
	if len(c.Waiters) == 0 {
		return 8
	}
	return c.Waiters[0]
}

// contSection is the report section of the mutex cases with n contenders:
// "contended" for the first, "contended-64" for a crowd of 64.
func (c Config) contSection(n int) string {
	if n == c.waiters() {
		return "contended"
	}
	return fmt.Sprintf("contended-%d", n)
}

// DefaultConfig is what make bench runs: about six minutes on two cores.
func DefaultConfig() Config {
	return Config{
		Runs: 5, Rounds: 7, Batch: 120 * time.Millisecond, MinOps: 20, MaxOps: 20000, Warmup: 20,
		Waiters: []int{8, 64}, Permits: 4, Contend: 400 * time.Millisecond, CRounds: 3,
		Held: 10000, RRounds: 3, PeerPoll: time.Millisecond, PgCount: true,
	}
}

// ShortConfig runs every case for a handful of iterations: a check that
// the benchmark works, not a measurement.
func ShortConfig() Config {
	return Config{
		Runs: 2, Rounds: 2, Batch: time.Millisecond, MinOps: 3, MaxOps: 5, Warmup: 1,
		Waiters: []int{8}, Permits: 4, Contend: 60 * time.Millisecond, CRounds: 1,
		Held: 200, RRounds: 1, PeerPoll: time.Millisecond, PgCount: true,
	}
}

// Conditions under which the latency cases run.
type cond int

const (
	idle cond = iota // nothing else runs: CPUs may sleep while a client waits
	busy             // a lowest-priority busy loop keeps the CPUs awake
	numConds
)

func (c cond) String() string { return [...]string{"idle", "busy"}[c] }

// Result is one run.
type Result struct {
	Config    Config
	Machine   Machine
	Down      map[string]error // services that could not be reached
	Elapsed   time.Duration
	BusyNote  string  // why the busy condition is missing, if it is
	ops       opSet   // every run's rounds of each case, pooled: what the tables show
	runs      []opSet // each run's cases, for the targets
	contended []*contCase
	semaphore []*contCase
	mix       []*mixCase
	renewal   []*renewCase
	conns     []*connCase
}

// Run measures everything whose service is reachable.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	start := time.Now()
	e, err := newEnv(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer e.shutdown()
	r := &Result{Config: cfg, Machine: e.machine(ctx), Down: e.down}
	logf := func(format string, args ...any) {
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, "%6.1fs  "+format+"\n", append([]any{time.Since(start).Seconds()}, args...)...)
		}
	}
	for s, err := range e.down {
		logf("%s unavailable, its cases are skipped: %v", s, err)
	}

	var sp *spinner
	if !cfg.NoBusy {
		if sp, err = startSpinner(); err != nil {
			r.BusyNote = err.Error()
		} else {
			defer sp.stop()
		}
	} else {
		r.BusyNote = "turned off (-busy=false)"
	}

	// The uncontended cases run cfg.Runs times, each time with new
	// factories and connections: the targets are decided on the median of
	// the runs, since one run can be lucky.
	m := e.mark()
	for i := range max(cfg.Runs, 1) {
		logf("setting up (run %d of %d)", i+1, max(cfg.Runs, 1))
		var set opSet
		set = append(set, casesMemory(e)...)
		set = append(set, casesFile(e)...)
		set = append(set, casesRedis(ctx, e)...)
		set = append(set, casesPostgres(ctx, e)...)
		set = append(set, casesEtcd(ctx, e)...)
		set = filter(set, func(c *opCase) bool { return cfg.want("uncontended", c.id) })
		for _, c := range set {
			c.rts = e.rts[c.service]
		}
		logf("uncontended: %d cases × %d rounds", len(set), cfg.Rounds)
		runOps(ctx, set, cfg, sp, newCounters(e))
		e.closeFrom(m)
		r.runs = append(r.runs, set)
	}
	r.ops = pool(r.runs)

	for _, n := range cfg.Waiters {
		r.contended = append(r.contended, filter(contendedCases(ctx, e, 1, n), func(c *contCase) bool { return cfg.want(cfg.contSection(n), c.id) })...)
	}
	r.semaphore = filter(contendedCases(ctx, e, cfg.Permits, cfg.waiters()), func(c *contCase) bool { return cfg.want("semaphore", c.id) })
	logf("contended: %d mutex and %d semaphore cases × %d rounds (%v waiters)", len(r.contended), len(r.semaphore), cfg.CRounds, cfg.Waiters)
	runContended(ctx, append(append([]*contCase{}, r.contended...), r.semaphore...), cfg, sp, newCounters(e))
	e.closeFrom(m)
	if cfg.PgCount {
		pgCounts(ctx, e, r.contended, cfg.Contend, logf)
	}
	r.mix = filter(append(mixCases(e), mixCasesPostgres(ctx, e)...), func(c *mixCase) bool { return cfg.want("mix", c.id) })
	logf("mix: %d cases of %d readers and a writer × %d rounds", len(r.mix), mixReaders, cfg.CRounds)
	runMix(ctx, r.mix, cfg, sp)
	e.closeFrom(m)

	logf("renewal of %d held locks", cfg.Held)
	r.renewal = runRenewal(ctx, e, logf)
	logf("connections for %d held Postgres locks", cfg.Held)
	r.conns = runConns(ctx, e)
	r.Elapsed = time.Since(start)
	r.Machine.Load[1] = loadAvg()
	logf("done")
	return r, nil
}

// pool returns each case of the first run with the rounds of every run.
func pool(runs []opSet) opSet {
	if len(runs) == 0 {
		return nil
	}
	var out opSet
	for _, c := range runs[0] {
		p := *c
		p.res = [numConds][]roundRes{}
		for _, set := range runs {
			if o := set.op(c.id); o != nil {
				if o.err != nil && p.err == nil {
					p.err = o.err
				}
				for cd := range p.res {
					p.res[cd] = append(p.res[cd], o.res[cd]...)
				}
			}
		}
		out = append(out, &p)
	}
	return out
}

func filter[T any, S ~[]T](xs S, keep func(T) bool) S {
	var out S
	for _, x := range xs {
		if keep(x) {
			out = append(out, x)
		}
	}
	return out
}

// conds lists the conditions a run measures, in the order of round r
// (alternating, so that neither always goes first).
func conds(sp *spinner, r int) []cond {
	if sp == nil {
		return []cond{idle}
	}
	if r%2 == 1 {
		return []cond{busy, idle}
	}
	return []cond{idle, busy}
}

var allocMetric = []metrics.Sample{{Name: "/gc/heap/allocs:objects"}}

func heapObjects() uint64 {
	metrics.Read(allocMetric)
	return allocMetric[0].Value.Uint64()
}

// runOps runs every case cfg.Rounds times in each condition, rotating the
// order each round.
func runOps(ctx context.Context, cases []*opCase, cfg Config, sp *spinner, ctr *counters) {
	for _, c := range cases {
		for i := 0; i < cfg.Warmup && c.err == nil; i++ {
			c.err = c.op(ctx)
		}
	}
	for r := 0; r < cfg.Rounds; r++ {
		for _, cd := range conds(sp, r) {
			sp.set(cd == busy)
			for i := range cases {
				c := cases[(i+r)%len(cases)]
				if c.err == nil {
					c.batch(ctx, cd, cfg, ctr)
				}
			}
		}
	}
	sp.set(false)
}

// batch times one batch of c; ctr, where it counts c's service (Redis),
// also has the server count its work, read outside the batch's counts.
func (c *opCase) batch(ctx context.Context, cd cond, cfg Config, ctr *counters) {
	inner := max(c.inner, 1)
	samples := make([]time.Duration, 0, 256)
	count := c.service == Redis && ctr.counts(c.service)
	var w0 work
	if count {
		var err error
		if w0, err = ctr.read(ctx, c.service); err != nil {
			count = false
		}
	}
	a0, rt0 := heapObjects(), c.rts.load()
	start := time.Now()
	for len(samples) < cfg.MinOps || len(samples) < cfg.MaxOps && time.Since(start) < cfg.Batch {
		t0 := time.Now()
		for j := 0; j < inner; j++ {
			if err := c.op(ctx); err != nil {
				c.err = err
				return
			}
		}
		samples = append(samples, time.Since(t0)/time.Duration(inner))
	}
	ops := float64(len(samples) * inner)
	res := roundRes{s: summarize(samples), allocs: float64(heapObjects()-a0) / ops, rts: float64(c.rts.load()-rt0) / ops}
	if count {
		if w1, err := ctr.read(ctx, c.service); err == nil {
			res.work, res.counted = w1.sub(w0).per(ops), true
		}
	}
	c.res[cd] = append(c.res[cd], res)
}
