package bench

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// fmtDur prints a duration with three significant digits in a unit that
// suits it.
func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "—"
	case d < time.Microsecond:
		return fmt.Sprintf("%d ns", d.Nanoseconds())
	case d < time.Millisecond:
		return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond))
	case d < time.Second:
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
}

func ratio(a, b float64) string {
	if a <= 0 || b <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func (c *opCase) summary(cd cond) summary { return medianSummary(rs(c.res[cd])) }

func rs(rr []roundRes) []summary {
	out := make([]summary, len(rr))
	for i, r := range rr {
		out[i] = r.s
	}
	return out
}

func (c *opCase) allocs(cd cond) float64 {
	var xs []float64
	for _, r := range c.res[cd] {
		xs = append(xs, r.allocs)
	}
	return median(xs)
}

// rts is the median over rounds of the round trips per operation.
func (c *opCase) roundTrips(cd cond) float64 {
	var xs []float64
	for _, r := range c.res[cd] {
		xs = append(xs, r.rts)
	}
	return median(xs)
}

// An opSet is the uncontended cases of one run, or of every run pooled.
type opSet []*opCase

func (s opSet) op(id string) *opCase {
	for _, c := range s {
		if c.id == id {
			return c
		}
	}
	return nil
}

func (s opSet) p50(id string, cd cond) time.Duration {
	if c := s.op(id); c != nil && c.err == nil {
		return c.summary(cd).p50
	}
	return 0
}

func (r *Result) p50(id string, cd cond) time.Duration { return r.ops.p50(id, cd) }

// bestPeer is the fastest peer of service's group at p50 (by the id
// prefix, "redis/"), or "".
func (s opSet) bestPeer(group string, cd cond) (string, time.Duration) {
	var best string
	var bd time.Duration
	for _, c := range s {
		if c.kind != peerKind || c.err != nil || group != groupOf(c.id) {
			continue
		}
		if d := c.summary(cd).p50; d > 0 && (bd == 0 || d < bd) {
			best, bd = c.id, d
		}
	}
	return best, bd
}

func groupOf(id string) string { g, _, _ := strings.Cut(id, "/"); return g }

func (c *contCase) agg(cd cond) (h summary, tput float64, maxWait time.Duration, fewest, most int) {
	var hs []summary
	var tp []float64
	var mw []time.Duration
	fewest = -1
	for _, x := range c.res[cd] {
		hs, tp, mw = append(hs, x.handoff), append(tp, x.throughput), append(mw, x.maxWait)
		if fewest < 0 || x.fewest < fewest {
			fewest = x.fewest
		}
		most = max(most, x.most)
	}
	return medianSummary(hs), median(tp), maxOf(mw), fewest, most
}

func maxOf(ds []time.Duration) time.Duration {
	var m time.Duration
	for _, d := range ds {
		m = max(m, d)
	}
	return m
}

func (r *Result) conditions() []cond {
	if r.BusyNote != "" {
		return []cond{idle}
	}
	return []cond{idle, busy}
}

func condTitle(cd cond) string {
	if cd == idle {
		return "idle CPUs (they may sleep while a client waits for a reply)"
	}
	return "busy CPUs (a SCHED_IDLE busy loop keeps them awake)"
}

// Markdown renders the run.
func (r *Result) Markdown() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	m := r.Machine
	cfg := r.Config
	w("## Machine\n\n")
	w("- %d CPUs, %s, Linux %s\n", m.CPUs, m.CPU, m.Kernel)
	w("- %s\n", m.Go)
	for _, s := range []string{Redis, Postgres, Etcd} {
		if v, ok := m.Services[s]; ok {
			w("- %s: %s\n", s, v)
		}
	}
	w("- run: %s, %s; %d uncontended rounds of %v per case and condition, %d contended rounds of %v, %s waiters, %d held locks\n",
		m.Date.Format("2006-01-02 15:04 UTC"), fmtDur(r.Elapsed.Round(time.Second)), cfg.Rounds, cfg.Batch, cfg.CRounds, cfg.Contend, waitersText(cfg.Waiters), cfg.Held)
	w("- 1-minute load average %s at the start, %s at the end (the benchmark itself adds about 1)\n", m.Load[0], m.Load[1])
	if r.BusyNote != "" {
		w("- busy condition not measured: %s\n", r.BusyNote)
	}

	if len(r.ops) > 0 {
		r.opsMarkdown(&b)
	}
	if len(r.contended) > 0 {
		r.contMarkdown(&b)
	}
	r.restMarkdown(&b)
	return b.String()
}

func (r *Result) opsMarkdown(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("\n## Uncontended acquire+release\n\n")
	w("Medians over the rounds of all %d runs of each round's p50, p99 and mean. \"round trips\" are counted on the client's connections (a request after a reply starts one; for etcd, one per RPC), per operation. \"× floor\" is p50 over the p50 of the raw lock of the same service; \"× best peer\" over the fastest peer on the same service; \"RTs\" is p50 over one round trip of the service (PING, SELECT 1, etcd Put). allocs/op counts every heap object the process allocated during the batch.\n", len(r.runs))
	for _, cd := range r.conditions() {
		w("\n### %s\n\n", condTitle(cd))
		w("| case | kind | p50 | p99 | mean | round trips | RTs | × floor | × best peer | allocs/op |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, c := range r.ops {
			if c.err != nil {
				w("| %s | %s | failed: %v | | | | | | | |\n", c.id, c.kind, c.err)
				continue
			}
			trips := "—"
			if c.rts != nil {
				trips = fmt.Sprintf("%.1f", c.roundTrips(cd))
			}
			s := c.summary(cd)
			rt, fl, bp := "—", "—", "—"
			if c.rtt != "" {
				rt = ratio(float64(s.p50), float64(r.p50(c.rtt, cd)))
			}
			if c.floor != "" {
				fl = ratio(float64(s.p50), float64(r.p50(c.floor, cd)))
			}
			if c.kind != floorKind {
				if _, d := r.ops.bestPeer(groupOf(c.id), cd); d > 0 {
					bp = ratio(float64(s.p50), float64(d))
				}
			}
			w("| %s — %s | %s | %s | %s | %s | %s | %s | %s | %s | %.1f |\n", c.id, c.label, c.kind,
				fmtDur(s.p50), fmtDur(s.p99), fmtDur(s.mean), trips, rt, fl, bp, c.allocs(cd))
		}
	}
	r.opsWorkMarkdown(b)

}

// opsWorkMarkdown: what Redis counted per uncontended operation (idle
// CPUs), for the cases where it was counted.
func (r *Result) opsWorkMarkdown(b *strings.Builder) {
	var rows []string
	for _, c := range r.ops {
		if w, ok := c.work(idle); ok && c.err == nil {
			rows = append(rows, fmt.Sprintf("| %s | %.1f | %.1f | %.1f | %.1f |\n", c.id, w.ops, w.scripts, w.usec, w.cpu))
		}
	}
	if len(rows) == 0 {
		return
	}
	b.WriteString("\n### Redis's work per operation (idle CPUs)\n\n")
	b.WriteString("Counted by the server over each batch (INFO commandstats and cpu), median over the rounds: commands (the ones scripts call included), scripts, µs spent in scripts, µs of the server's CPU.\n\n")
	b.WriteString("| case | calls | scripts | µs in scripts | µs CPU |\n|---|---:|---:|---:|---:|\n")
	for _, row := range rows {
		b.WriteString(row)
	}
}

// work is the median over rounds of the server's work per operation.
func (c *opCase) work(cd cond) (work, bool) {
	var ws []work
	for _, r := range c.res[cd] {
		if r.counted {
			ws = append(ws, r.work)
		}
	}
	return medianWork(ws), len(ws) > 0
}

func waitersText(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, " and ")
}

func (r *Result) contMarkdown(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	cfg := r.Config
	for _, n := range cfg.Waiters {
		var cs []*contCase
		for _, c := range r.contended {
			if c.n == n {
				cs = append(cs, c)
			}
		}
		if len(cs) == 0 {
			continue
		}
		w("\n## Contention: %d waiters on one name (WithWait)\n\n", n)
		if n != cfg.waiters() {
			w("The network backends' cases with a factory (or client) per waiter, as %d processes would wait.\n\n", n)
		}
		w("Each waiter takes the lock and gives it back at once, for %v per round. Hand-off: from the holder calling Release to the next holder's Acquire returning, counted when the lock passes to another waiter. \"RTs\" is hand-off p50 over one round trip of the service (PING, SELECT 1, etcd Put) in the same condition. Server work per acquisition is counted by the server over the round: Postgres statements (the database's xact_commit, in one more round of 2 passes on connections of the case's own, idle CPUs only), Redis commands and the scripts among them (INFO commandstats), etcd unary RPCs, keys written and watch responses sent (its /metrics). Re-takes: the share of acquisitions made by the waiter that had just released. Max wait is the longest single Acquire over all rounds (starvation); acquisitions per waiter show fairness. Exclusion: no two holders were ever seen inside at once.\n", cfg.Contend)
		for _, cd := range r.conditions() {
			w("\n### %s\n\n", condTitle(cd))
			w("| case | kind | hand-off p50 | p99 | mean | RTs | acquires/s | × best peer | server work/acq | re-takes | max wait | per waiter | exclusion |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
			for _, c := range cs {
				r.contRow(b, c, cd, true)
			}
			floorNote(b, cs, cd)
			flockNote(b, cs, cd)
		}
	}
}

// floorNote puts pglock (a factory each) beside the blocking advisory
// lock floor of the same table: hand-off p50 and throughput as ratios,
// and the statements of each.
func floorNote(b *strings.Builder, cs []*contCase, cd cond) {
	var ours, floor *contCase
	for _, c := range cs {
		switch {
		case c.err != nil:
		case c.id == idPglock:
			ours = c
		case c.id == idPgBlocking:
			floor = c
		}
	}
	if ours == nil || floor == nil {
		return
	}
	h, tput, _, _, _ := ours.agg(cd)
	fh, ftput, _, _, _ := floor.agg(cd)
	fmt.Fprintf(b, "\npglock, a factory each, against the blocking advisory lock: hand-off p50 %s, acquires/s %s", ratio(float64(h.p50), float64(fh.p50)), ratio(tput, ftput))
	if w, ok := ours.perAcquire(cd); ok {
		fw, _ := floor.perAcquire(cd)
		fmt.Fprintf(b, ", statements per acquisition %.1f against %.1f", w.ops, fw.ops)
	}
	b.WriteString(".\n")
}

// flockNote puts flock (a factory each) beside blocking flock(2) (the
// gofrs/flock case) of the same table: the longest wait as a ratio, and
// the re-takes of each.
func flockNote(b *strings.Builder, cs []*contCase, cd cond) {
	var ours, kernel *contCase
	for _, c := range cs {
		switch {
		case c.err != nil:
		case c.id == idFlock:
			ours = c
		case c.id == idGofrs:
			kernel = c
		}
	}
	if ours == nil || kernel == nil {
		return
	}
	_, _, mw, _, _ := ours.agg(cd)
	_, _, kmw, _, _ := kernel.agg(cd)
	rt, _ := ours.retakeShare(cd)
	krt, _ := kernel.retakeShare(cd)
	fmt.Fprintf(b, "\nflock, a factory each, against blocking flock(2): max wait %s (re-takes %.0f %% against %.0f %%).\n", ratio(float64(mw), float64(kmw)), 100*rt, 100*krt)
}

func (r *Result) restMarkdown(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	cfg := r.Config
	if len(r.semaphore) > 0 {
		w("\n## Semaphore: %d waiters on %d permits\n\n", cfg.waiters(), r.semaphore[0].limit)
		w("Each holder keeps its permit for %v, so at most %d × 1/(%v + acquire+release) acquisitions per second are possible. Exclusion: never more than %d holders seen inside at once.\n",
			semHold, r.semaphore[0].limit, semHold, r.semaphore[0].limit)
		for _, cd := range r.conditions() {
			w("\n### %s\n\n", condTitle(cd))
			w("| case | kind | acquires/s | max wait | per waiter | most inside | exclusion |\n|---|---|---:|---:|---:|---:|---|\n")
			for _, c := range r.semaphore {
				r.contRow(b, c, cd, false)
			}
		}
	}

	if len(r.renewal) > 0 {
		n := r.renewal[0].held
		w("\n## Renewal of %d held locks (idle CPUs)\n\n", n)
		w("The cost of renewing every lock once: round trips, commands, wall time of the passes (summed), and the benchmark process's CPU. Ours and concurrency.Mutex renew in the background (TTL %v, every third of it); the hook on their client times each pass. The peers that renew one lock per call are swept by hand.\n\n", renewTTL)
		w("| case | kind | round trips | commands | wall | × floor | pass p50 | pass p99 | client CPU | heap per held lock |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		floors := map[string]time.Duration{}
		for _, c := range r.renewal {
			if c.kind == floorKind && c.err == nil {
				floors[c.service] = c.wallPerAll()
			}
		}
		for _, c := range r.renewal {
			if c.err != nil {
				w("| %s — %s | %s | failed: %v | | | | | | |\n", c.id, c.label, c.kind, c.err)
				continue
			}
			if c.renewed == 0 {
				w("| %s — %s | %s | no pass seen | | | | | | |\n", c.id, c.label, c.kind)
				continue
			}
			var rts, cmds int
			var ds []time.Duration
			for _, p := range c.passes {
				rts, cmds = rts+p.rts, cmds+p.cmds
				ds = append(ds, p.d)
			}
			per := float64(c.held) / float64(c.renewed) // renewals of all the locks in the measured windows
			s := summarize(ds)
			fl := "—"
			if c.kind != floorKind {
				fl = ratio(float64(c.wallPerAll()), float64(floors[c.service]))
			}
			heap := "—"
			if c.perLock > 0 {
				heap = fmt.Sprintf("%.0f B", c.perLock)
			}
			w("| %s — %s | %s | %.0f | %.0f | %s | %s | %s | %s | %s | %s |\n", c.id, c.label, c.kind,
				float64(rts)*per, float64(cmds)*per, fmtDur(c.wallPerAll()), fl,
				fmtDur(s.p50), fmtDur(s.p99), fmtDur(time.Duration(float64(c.cpu)*per)), heap)
		}
	}

	for _, c := range r.conns {
		w("\n## Postgres connections for %d held locks\n\n", c.held)
		if c.err != nil {
			w("%s: failed: %v\n", c.label, c.err)
			continue
		}
		w("Release p50 while the others are held, beside an uncontended Acquire+Release with nothing held (idle CPUs, from the table above).\n\n")
		w("| case | held locks | connections | server max_connections | acquires/s (16 at a time) | Release p50 | p99 | uncontended Acquire+Release p50 |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
		w("| %s | %d | %d | %d | %.0f | %s | %s | %s |\n", c.label, c.held, c.conns, c.maxConns, c.rate,
			fmtDur(c.release.p50), fmtDur(c.release.p99), fmtDur(r.p50(idPglock, idle)))
	}

	r.mixMarkdown(w)
	r.targetsMarkdown(w)
	if ps := r.Problems(); len(ps) > 0 {
		w("\n## Problems\n\n")
		for _, p := range ps {
			w("- %s\n", p)
		}
	}
	if len(r.Down) > 0 {
		w("\n## Skipped\n\n")
		keys := make([]string, 0, len(r.Down))
		for k := range r.Down {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			w("- %s unavailable: %v\n", k, r.Down[k])
		}
	}
}

// wallPerAll is the wall time of the passes it took to renew every lock
// once.
func (c *renewCase) wallPerAll() time.Duration {
	if c.renewed == 0 {
		return 0
	}
	var wall time.Duration
	for _, p := range c.passes {
		wall += p.d
	}
	return time.Duration(float64(wall) * float64(c.held) / float64(c.renewed))
}

func condNames(cs []cond) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.String())
	}
	return out
}

func (r *Result) contRow(b *strings.Builder, c *contCase, cd cond, mutex bool) {
	if c.err != nil {
		fmt.Fprintf(b, "| %s — %s | %s | failed: %v |\n", c.id, c.label, c.kind, c.err)
		return
	}
	h, tput, mw, fewest, most := c.agg(cd)
	excl := "held"
	if c.overrun.Load() {
		excl = "**VIOLATED**"
	}
	if !mutex {
		fmt.Fprintf(b, "| %s — %s | %s | %.0f | %s | %d–%d | %d | %s |\n", c.id, c.label, c.kind, tput, fmtDur(mw), fewest, most, c.maxIn.Load(), excl)
		return
	}
	rt, bp := "—", "—"
	if c.rtt != "" {
		rt = ratio(float64(h.p50), float64(r.p50(c.rtt, cd)))
	}
	if c.kind == oursKind {
		if best := r.bestContPeer(groupOf(c.id), c.n, cd); best > 0 {
			bp = ratio(tput, best)
		}
	}
	retakes := "—"
	if share, ok := c.retakeShare(cd); ok {
		retakes = fmt.Sprintf("%.0f %%", 100*share)
	}
	fmt.Fprintf(b, "| %s — %s | %s | %s | %s | %s | %s | %.0f | %s | %s | %s | %s | %d–%d | %s |\n", c.id, c.label, c.kind,
		fmtDur(h.p50), fmtDur(h.p99), fmtDur(h.mean), rt, tput, bp, c.workText(cd), retakes, fmtDur(mw), fewest, most, excl)
}

// perAcquire is the median over the counted rounds of the server's work
// per acquisition.
func (c *contCase) perAcquire(cd cond) (work, bool) {
	rr := c.res[cd]
	if c.service == Postgres {
		// Counted in a round of its own, with idle CPUs (pgCount).
		rr = nil
		if c.count != nil && cd == idle {
			rr = []contRes{*c.count}
		}
	}
	var ws []work
	for _, x := range rr {
		if x.counted && x.total > 0 {
			ws = append(ws, x.work.per(float64(x.total)))
		}
	}
	return medianWork(ws), len(ws) > 0
}

// medianWork is the median of each figure of ws.
func medianWork(ws []work) work {
	var ops, scripts, usec, cpu, writes, watch []float64
	for _, w := range ws {
		ops, scripts, usec, cpu = append(ops, w.ops), append(scripts, w.scripts), append(usec, w.usec), append(cpu, w.cpu)
		writes, watch = append(writes, w.writes), append(watch, w.watch)
	}
	return work{ops: median(ops), scripts: median(scripts), usec: median(usec), cpu: median(cpu), writes: median(writes), watch: median(watch)}
}

// redisWorkText is the Redis server's work per operation.
func redisWorkText(w work) string {
	return fmt.Sprintf("%.1f calls, %.1f scripts, %.1f µs in scripts, %.1f µs CPU", w.ops, w.scripts, w.usec, w.cpu)
}

func (c *contCase) workText(cd cond) string {
	w, ok := c.perAcquire(cd)
	if !ok {
		return "—"
	}
	switch c.service {
	case Postgres:
		return fmt.Sprintf("%.1f statements", w.ops)
	case Redis:
		return redisWorkText(w)
	case Etcd:
		return fmt.Sprintf("%.1f RPCs, %.1f writes, %.1f watch responses", w.ops, w.writes, w.watch)
	}
	return "—"
}

// retakeShare is the median over rounds of the share of acquisitions made
// by the contender that had just released the lock.
func (c *contCase) retakeShare(cd cond) (float64, bool) {
	var xs []float64
	for _, x := range c.res[cd] {
		if x.total > 0 {
			xs = append(xs, float64(x.retakes)/float64(x.total))
		}
	}
	return median(xs), len(xs) > 0
}

// bestContPeer is the highest contended throughput of a peer in group
// with n contenders.
func (r *Result) bestContPeer(group string, n int, cd cond) float64 {
	var best float64
	for _, c := range r.contended {
		if c.kind == peerKind && c.err == nil && groupOf(c.id) == group && c.n == n {
			_, t, _, _, _ := c.agg(cd)
			best = max(best, t)
		}
	}
	return best
}

// A target is a ratio of one run's figures that must not exceed limit. It
// is decided on the median over the runs: a single run can be lucky.
type target struct {
	what  string
	limit float64
	ratio func(s opSet, cd cond) (float64, bool)
}

func (r *Result) targets() []target {
	p50 := func(id, of string) func(opSet, cond) (float64, bool) {
		return func(s opSet, cd cond) (float64, bool) {
			a, b := s.p50(id, cd), s.p50(of, cd)
			return float64(a) / float64(b), a > 0 && b > 0
		}
	}
	peer := func(id string) func(opSet, cond) (float64, bool) {
		return func(s opSet, cd cond) (float64, bool) {
			a := s.p50(id, cd)
			_, b := s.bestPeer(groupOf(id), cd)
			return float64(a) / float64(b), a > 0 && b > 0
		}
	}
	trips := func(id, of string) func(opSet, cond) (float64, bool) {
		return func(s opSet, cd cond) (float64, bool) {
			a, b := s.op(id), s.op(of)
			if a == nil || b == nil || a.err != nil || b.err != nil || a.rts == nil {
				return 0, false
			}
			x, y := a.roundTrips(cd), b.roundTrips(cd)
			return x / y, y > 0
		}
	}
	// Round trips are counted on connections that also carry a little
	// background traffic (health checks, lease keep-alives): 5 % allows it.
	return []target{
		{"redislock round trips = raw lock's", 1.05, trips(idRedislock, idRedisFloor)},
		{"pglock round trips = raw lock's", 1.05, trips(idPglock, idPgFloor)},
		{"etcdlock round trips = raw lock's", 1.05, trips(idEtcdlock, idEtcdFloor)},
		{"redislock p50 ≤ 1.5× raw lock", 1.5, p50(idRedislock, idRedisFloor)},
		{"pglock p50 ≤ 1.5× raw lock", 1.5, p50(idPglock, idPgFloor)},
		{"pglock shared p50 ≤ 1.5× raw shared lock", 1.5, p50(idPglock+" shared", idPgShared)},
		{"etcdlock p50 ≤ 1.5× raw lock", 1.5, p50(idEtcdlock, idEtcdFloor)},
		{"flock p50 ≤ 1.5× open+flock+close", 1.5, p50(idFlock, idFlockFloor)},
		{"redislock p50 ≤ 1.3× best peer", 1.3, peer(idRedislock)},
		{"etcdlock p50 ≤ 1.3× best peer", 1.3, peer(idEtcdlock)},
		{"flock p50 ≤ 1.5× gofrs/flock", 1.5, p50(idFlock, idGofrs)},
	}
}

func (r *Result) targetsMarkdown(w func(format string, args ...any)) {
	w("\n## Targets (median of %d runs)\n\n", len(r.runs))
	w("Each cell: the median over the runs of the run's ratio, then every run's ratio.\n\n")
	w("| target | %s | met |\n|---|%s---|\n", strings.Join(condNames(r.conditions()), " | "), strings.Repeat("---|", len(r.conditions())))
	for _, t := range r.targets() {
		w("| %s |", t.what)
		ok, seen := true, false
		for _, cd := range r.conditions() {
			var xs []float64
			var each []string
			for _, set := range r.runs {
				if x, known := t.ratio(set, cd); known {
					xs = append(xs, x)
					each = append(each, fmt.Sprintf("%.2f", x))
				}
			}
			if len(xs) == 0 {
				w(" — |")
				continue
			}
			m := median(xs)
			ok, seen = ok && m <= t.limit, true
			w(" **%.2f×** (%s) |", m, strings.Join(each, ", "))
		}
		switch {
		case !seen:
			w(" — |\n")
		case len(r.runs) < minRuns:
			w(" undecided: fewer than %d runs |\n", minRuns)
		case ok:
			w(" yes |\n")
		default:
			w(" **no** |\n")
		}
	}
}

// minRuns is the fewest runs a target is decided on.
const minRuns = 5

// Problems lists what went wrong: cases that failed and exclusion that did
// not hold.
func (r *Result) Problems() []string {
	var ps []string
	for _, c := range r.ops {
		if c.err != nil {
			ps = append(ps, fmt.Sprintf("uncontended %s: %v", c.id, c.err))
		}
	}
	for _, group := range [][]*contCase{r.contended, r.semaphore} {
		for _, c := range group {
			if c.err != nil {
				ps = append(ps, fmt.Sprintf("contended %s (%d waiters, limit %d): %v", c.id, c.n, c.limit, c.err))
			}
			if c.overrun.Load() {
				ps = append(ps, fmt.Sprintf("contended %s (%d waiters, limit %d): more than %d holders at once", c.id, c.n, c.limit, c.limit))
			}
		}
	}
	ps = append(ps, r.mixProblems()...)
	for _, c := range r.renewal {
		if c.err != nil {
			ps = append(ps, fmt.Sprintf("renewal %s: %v", c.id, c.err))
		}
	}
	for _, c := range r.conns {
		if c.err != nil {
			ps = append(ps, fmt.Sprintf("connections %s: %v", c.label, c.err))
		}
	}
	return ps
}

// Counts reports how many measurements each case made, keyed by section,
// condition and case id: a case that never ran is missing or zero.
func (r *Result) Counts() map[string]int {
	out := map[string]int{}
	for _, cd := range r.conditions() {
		for _, c := range r.ops {
			out["uncontended/"+cd.String()+"/"+c.id] = c.summary(cd).n
		}
		for _, sec := range []struct {
			name func(*contCase) string
			cs   []*contCase
		}{
			{func(c *contCase) string { return r.Config.contSection(c.n) }, r.contended},
			{func(*contCase) string { return "semaphore" }, r.semaphore},
		} {
			for _, c := range sec.cs {
				n := 0
				for _, x := range c.res[cd] {
					n += x.total
				}
				out[sec.name(c)+"/"+cd.String()+"/"+c.id] = n
			}
		}
	}
	for _, cd := range r.conditions() {
		for _, c := range r.mix {
			n := 0
			for _, x := range c.res[cd] {
				n += x.total
			}
			out["mix/"+cd.String()+"/"+c.id] = n
		}
	}
	for _, c := range r.renewal {
		out["renewal/"+c.id] = c.renewed
	}
	for _, c := range r.conns {
		out["connections/postgres"] = c.conns
	}
	return out
}

// ServerWork reports the server's work per acquisition of each contended
// case it was counted for (Postgres statements, Redis commands, etcd unary
// RPCs), keyed as Counts keys them.
func (r *Result) ServerWork() map[string]float64 {
	out := map[string]float64{}
	for _, cd := range r.conditions() {
		for _, c := range r.contended {
			if w, ok := c.perAcquire(cd); ok && c.err == nil {
				out[r.Config.contSection(c.n)+"/"+cd.String()+"/"+c.id] = w.ops
			}
		}
	}
	return out
}
