// Command bench runs the family's benchmark (make bench): every backend
// beside its floor and beside the libraries users would otherwise pick, in
// one process and one run, against the services of scripts/services.sh
// (endpoints from LOCK_TEST_POSTGRES_DSN, LOCK_TEST_REDIS_ADDR and
// LOCK_TEST_ETCD_ENDPOINTS). It prints a Markdown report on stdout and its
// progress on stderr.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"

	"github.com/ubgo/lock/bench"
)

func main() {
	bench.SpinIfChild()
	d := bench.DefaultConfig()
	short := flag.Bool("short", false, "run every case for a handful of iterations (a smoke test, not a measurement)")
	runs := flag.Int("runs", d.Runs, "runs of the uncontended cases, each with new factories and connections; targets are decided on their median (at least 5)")
	rounds := flag.Int("rounds", d.Rounds, "interleaved rounds of the uncontended cases, per run")
	batch := flag.Duration("batch", d.Batch, "time per uncontended case per round and condition")
	contend := flag.Duration("contend", d.Contend, "time per contended case per round and condition")
	crounds := flag.Int("contend-rounds", d.CRounds, "rounds of the contended and semaphore cases")
	waiters := flag.String("waiters", joinInts(d.Waiters), "contenders on one name, comma-separated: every contended case runs with the first, the network backends also with the others")
	held := flag.Int("held", d.Held, "locks held for the renewal and connection cases")
	rrounds := flag.Int("renew-rounds", d.RRounds, "rounds of the renewal cases")
	pgCount := flag.Bool("pg-count", d.PgCount, "count the statements of the contended Postgres cases (two more passes of each, on connections of their own)")
	poll := flag.Duration("peer-poll", d.PeerPoll, "retry interval of the peers that poll while waiting (bsm/redislock, redsync)")
	busy := flag.Bool("busy", true, "also measure with a lowest-priority (SCHED_IDLE) busy loop keeping the CPUs awake")
	only := flag.String("only", "", "run only the cases whose section/id matches this regexp (uncontended/redis/PING, contended/etcd/etcdlock, renewal/redis/redislock, connections/postgres)")
	quiet := flag.Bool("q", false, "no progress on stderr")
	flag.Parse()

	ws, err := parseInts(*waiters)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: -waiters:", err)
		os.Exit(2)
	}
	cfg := bench.Config{
		Runs: *runs, Rounds: *rounds, Batch: *batch, MinOps: d.MinOps, MaxOps: d.MaxOps, Warmup: d.Warmup,
		Waiters: ws, Permits: d.Permits, Contend: *contend, CRounds: *crounds,
		Held: *held, RRounds: *rrounds, PeerPoll: *poll, PgCount: *pgCount, NoBusy: !*busy,
	}
	if *short {
		cfg = bench.ShortConfig()
		cfg.NoBusy = !*busy
	}
	if *only != "" {
		re, err := regexp.Compile(*only)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench: -only:", err)
			os.Exit(2)
		}
		cfg.Only = re
	}
	if !*quiet {
		cfg.Log = os.Stderr
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	r, err := bench.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	fmt.Print(r.Markdown())
	if ps := r.Problems(); len(ps) > 0 {
		os.Exit(1)
	}
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q: want positive numbers, comma-separated", s)
		}
		out = append(out, n)
	}
	return out, nil
}
