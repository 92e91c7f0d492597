package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/filelock"
	"github.com/ubgo/lock/flock"
	"github.com/ubgo/lock/memlock"
)

// mixReaders and mixHold shape the mix: mixReaders shared holders and one
// exclusive holder on one name, each keeping it for mixHold per turn.
const (
	mixReaders = 7
	mixHold    = time.Millisecond
)

// mixCase is readers and a writer on one name (WithShared beside an
// exclusive Acquire that waits): what a shared mode costs readers, how
// long its writer waits, and whether the readers that wait for a writer
// get in together once it leaves.
type mixCase struct {
	id      string
	label   string
	kind    kind
	readers []contender
	writer  contender
	err     error
	overrun atomic.Bool // a reader and the writer were seen inside at once
	res     [numConds][]mixRes
}

type mixRes struct {
	readers    float64       // reader acquisitions per second
	writes     float64       // writer acquisitions per second
	writerWait summary       // the writer's Acquire
	maxWriter  time.Duration // its longest
	maxReader  time.Duration // the longest reader Acquire
	mostIn     int           // the most readers seen inside at once
	total      int           // acquisitions of all
}

// mixCases builds the file backends' mixes beside the kernel's own
// shared and exclusive flock(2), and memlock's.
func mixCases(e *env) []*mixCase {
	dir := filepath.Join(e.dir, "mix")
	dirErr := os.MkdirAll(dir, 0o755)
	var out []*mixCase
	add := func(c *mixCase, mk func(shared bool) contender) {
		c.err = dirErr
		for range mixReaders {
			c.readers = append(c.readers, mk(true))
		}
		c.writer = mk(false)
		out = append(out, c)
	}
	mf := memlock.NewFactory(memlock.WithLogger(nil), memlock.WithWait())
	e.defer_(func() { mf.Close() })
	add(&mixCase{id: "memory/memlock", label: "memlock, one factory", kind: oursKind}, func(shared bool) contender {
		return holding(func(ctx context.Context) (*memlock.Holder, error) { return mf.Acquire(ctx, "mix", opts(shared)...) })
	})
	kpath := filepath.Join(dir, "kernel.lock")
	add(&mixCase{id: "file/flock(2)", label: "flock(2) LOCK_SH or LOCK_EX, blocking, a descriptor each", kind: floorKind}, func(shared bool) contender {
		how := unix.LOCK_EX
		if shared {
			how = unix.LOCK_SH
		}
		fd := -1
		return contender{
			lock: func(context.Context) (err error) {
				if fd, err = unix.Open(kpath, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o644); err != nil {
					return err
				}
				for err = unix.Flock(fd, how); err == unix.EINTR; err = unix.Flock(fd, how) {
				}
				return err
			},
			unlock: func() error { return unix.Close(fd) },
		}
	})
	fdir := filepath.Join(dir, "flock")
	add(&mixCase{id: "file/flock", label: "flock, a factory each", kind: oursKind}, func(shared bool) contender {
		f := flock.NewFactory(flock.WithDir(fdir), flock.WithLogger(nil), flock.WithWait())
		e.defer_(func() { f.Close() })
		return holding(func(ctx context.Context) (*flock.Holder, error) { return f.Acquire(ctx, "mix", opts(shared)...) })
	})
	ldir := filepath.Join(dir, "filelock")
	add(&mixCase{id: "file/filelock", label: "filelock, a factory each", kind: oursKind}, func(shared bool) contender {
		f := filelock.NewFactory(filelock.WithDir(ldir), filelock.WithLogger(nil), filelock.WithWait())
		e.defer_(func() { f.Close() })
		return holding(func(ctx context.Context) (*filelock.Holder, error) { return f.Acquire(ctx, "mix", opts(shared)...) })
	})
	return out
}

func opts(shared bool) []lock.Option {
	if shared {
		return []lock.Option{lock.WithShared()}
	}
	return nil
}

// runMix runs every mix case cfg.CRounds times in each condition,
// rotating the order each round, one case at a time.
func runMix(ctx context.Context, cases []*mixCase, cfg Config, sp *spinner) {
	for _, c := range cases {
		if c.err == nil { // a case that could not be built keeps its error
			c.err = warm(ctx, append([]contender{c.writer}, c.readers...))
		}
	}
	for r := 0; r < cfg.CRounds; r++ {
		for _, cd := range conds(sp, r) {
			sp.set(cd == busy)
			for i := range cases {
				c := cases[(i+r)%len(cases)]
				if c.err == nil {
					var res mixRes
					if res, c.err = c.window(ctx, cfg.Contend); c.err == nil {
						c.res[cd] = append(c.res[cd], res)
					}
				}
			}
		}
	}
	sp.set(false)
}

// window lets the readers and the writer run for d, each holding the name
// for mixHold per turn.
func (c *mixCase) window(ctx context.Context, d time.Duration) (mixRes, error) {
	ctx, cancel := context.WithTimeout(ctx, d+time.Minute)
	defer cancel()
	var (
		rec        sync.Mutex // guards what follows
		writerWait []time.Duration
		maxReader  time.Duration
		reads      int
		firstErr   error
		in         atomic.Int32 // readers inside; -1 while the writer is
		mostIn     atomic.Int32
		wg         sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(d)
	fail := func(err error) {
		rec.Lock()
		firstErr = cmpOr(firstErr, err)
		rec.Unlock()
		cancel()
	}
	run := func(ct contender, writer bool) {
		defer wg.Done()
		for time.Now().Before(deadline) {
			t0 := time.Now()
			if err := ct.lock(ctx); err != nil {
				fail(err)
				return
			}
			wait := time.Since(t0)
			if writer {
				if !in.CompareAndSwap(0, -1) {
					c.overrun.Store(true)
				}
			} else {
				n := in.Add(1)
				if n <= 0 {
					c.overrun.Store(true)
				}
				for m := mostIn.Load(); n > m && !mostIn.CompareAndSwap(m, n); m = mostIn.Load() {
				}
			}
			rec.Lock()
			if writer {
				writerWait = append(writerWait, wait)
			} else {
				reads++
				maxReader = max(maxReader, wait)
			}
			rec.Unlock()
			time.Sleep(mixHold)
			if writer {
				in.Store(0)
			} else {
				in.Add(-1)
			}
			if err := ct.unlock(); err != nil {
				fail(err)
				return
			}
		}
	}
	wg.Add(1 + len(c.readers))
	go run(c.writer, true)
	for _, r := range c.readers {
		go run(r, false)
	}
	wg.Wait()
	if firstErr != nil {
		return mixRes{}, firstErr
	}
	secs := time.Since(start).Seconds()
	return mixRes{
		readers: float64(reads) / secs, writes: float64(len(writerWait)) / secs,
		writerWait: summarize(writerWait), maxWriter: slices.Max(append(writerWait, 0)), maxReader: maxReader, mostIn: int(mostIn.Load()),
		total: reads + len(writerWait),
	}, nil
}

// agg is the median over rounds of each figure, but the longest waits are
// over all rounds.
func (c *mixCase) agg(cd cond) (readers, writes float64, ww summary, maxW, maxR time.Duration, mostIn int) {
	var rs, ws []float64
	var wws []summary
	var ins []int
	for _, x := range c.res[cd] {
		rs, ws, wws, ins = append(rs, x.readers), append(ws, x.writes), append(wws, x.writerWait), append(ins, x.mostIn)
		maxW, maxR = max(maxW, x.maxWriter), max(maxR, x.maxReader)
	}
	return median(rs), median(ws), medianSummary(wws), maxW, maxR, median(ins)
}

func (r *Result) mixMarkdown(w func(format string, args ...any)) {
	if len(r.mix) == 0 {
		return
	}
	w("\n## Readers and a writer: %d shared holders and 1 exclusive on one name (WithWait)\n\n", mixReaders)
	w("Each holder keeps the name for %v per turn and asks again at once, for %v per round. Readers/s and writes/s are acquisitions per second (medians over rounds); the writer's wait p50 is the median over rounds, the longest waits are over all rounds. Readers together: the most readers seen inside at once in a round, median over rounds (%d: all of them). Exclusion: no reader was seen inside with the writer.\n", mixHold, r.Config.Contend, mixReaders)
	for _, cd := range r.conditions() {
		w("\n### %s\n\n", condTitle(cd))
		w("| case | kind | readers/s | writes/s | writer wait p50 | writer max wait | reader max wait | readers together | exclusion |\n|---|---|---:|---:|---:|---:|---:|---:|---|\n")
		for _, c := range r.mix {
			if c.err != nil {
				w("| %s — %s | %s | failed: %v |\n", c.id, c.label, c.kind, c.err)
				continue
			}
			rs, ws, ww, maxW, maxR, mostIn := c.agg(cd)
			excl := "held"
			if c.overrun.Load() {
				excl = "**VIOLATED**"
			}
			w("| %s — %s | %s | %.0f | %.0f | %s | %s | %s | %d of %d | %s |\n", c.id, c.label, c.kind, rs, ws, fmtDur(ww.p50), fmtDur(maxW), fmtDur(maxR), mostIn, mixReaders, excl)
		}
		pgMixNote(w, r.mix, cd)
	}
}

// mixProblems are the mixes that failed or let a reader in with the
// writer.
func (r *Result) mixProblems() []string {
	var ps []string
	for _, c := range r.mix {
		if c.err != nil {
			ps = append(ps, fmt.Sprintf("mix %s: %v", c.id, c.err))
		}
		if c.overrun.Load() {
			ps = append(ps, fmt.Sprintf("mix %s: a reader inside with the writer", c.id))
		}
	}
	return ps
}
