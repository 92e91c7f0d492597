package gocronlock_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/contrib/gocronlock"
	"github.com/ubgo/lock/etcdlock"
	"github.com/ubgo/lock/internal/testenv"
	"github.com/ubgo/lock/pglock"
	"github.com/ubgo/lock/redislock"
)

// ownerTTL is the lease of the replicas' locks on the backends that lease
// (Redis, etcd): a killed owner's lock frees within it.
const ownerTTL = 2 * time.Second

// ownerBackends build a replica's lock.Locker on a client of its own, as
// a process of its own would.
var ownerBackends = map[string]func(t *testing.T) lock.Locker{
	"redis": func(t *testing.T) lock.Locker {
		rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
		t.Cleanup(func() { rdb.Close() })
		testenv.Need(t, "redis", func(ctx context.Context) error { return rdb.Ping(ctx).Err() })
		f := redislock.NewFactory(rdb, redislock.WithTTL(ownerTTL), redislock.WithLogger(nil))
		t.Cleanup(func() { f.Close() })
		return f.AsLocker()
	},
	"postgres": func(t *testing.T) lock.Locker {
		pool, err := pgxpool.New(context.Background(), testenv.PostgresDSN())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		testenv.Need(t, "postgres", pool.Ping)
		f := pglock.NewFactory(pool, pglock.WithLogger(nil))
		t.Cleanup(func() { f.Close() })
		return f.AsLocker()
	},
	"etcd": func(t *testing.T) lock.Locker {
		cli, err := clientv3.New(clientv3.Config{Endpoints: testenv.EtcdEndpoints(), DialTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		testenv.Need(t, "etcd", func(ctx context.Context) error { _, err := cli.Get(ctx, "ping"); return err })
		f := etcdlock.NewFactory(cli, etcdlock.WithTTL(ownerTTL), etcdlock.WithLogger(nil))
		t.Cleanup(func() { f.Close() })
		return f.AsLocker()
	},
}

// The child role and the variables that tell a replica what to be.
const (
	ownerRole    = "gocron-replica"
	ownerBackend = "LOCK_TEST_GOCRON_BACKEND"
	ownerJob     = "LOCK_TEST_GOCRON_JOB"
	ownerMark    = "gocron-replica:" // starts every line a replica reports
)

// ownerTicks is how many consecutive ticks an owner must run alone.
const ownerTicks = 3

// TestOwnerKeepsJob is the guide's promise about who runs a job: the
// first replica to lock it keeps running every tick while it lives, and
// when it goes away another replica takes the job over and keeps it in
// turn. Three replicas, each a process of its own with its own client,
// run a cron job every second under gocronlock.New's defaults. The owner
// must run ownerTicks consecutive ticks while the others fire and meet
// ErrLocked; once it is killed (SIGKILL), another must take over within
// the guide's bound (the backend frees the lock: the TTL, or at once for
// a Postgres session; then the next tick) and keep the job; once that one
// shuts down cleanly, the last must take over. No tick may ever run twice,
// and every Lock error must be contention.
func TestOwnerKeepsJob(t *testing.T) {
	if testenv.Child() == ownerRole {
		runReplica(t)
		return
	}
	for _, name := range []string{"redis", "postgres", "etcd"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ownerBackends[name](t) // skips the test when the service is down
			testOwner(t, name)
		})
	}
}

// runReplica is one replica: a scheduler with a job every second, which
// reports on stdout every run and every skip, and shuts down cleanly when
// its stdin closes.
func runReplica(t *testing.T) {
	var (
		mu       sync.Mutex
		stopping bool
	)
	report := func(kind string, tick int64, detail string) {
		mu.Lock()
		defer mu.Unlock()
		if !stopping {
			fmt.Printf("%s %s %d %q\n", ownerMark, kind, tick, detail)
		}
	}
	now := func() int64 { return time.Now().Truncate(time.Second).Unix() }
	locker := gocronlock.New(ownerBackends[os.Getenv(ownerBackend)](t), gocronlock.WithLogger(nil))
	if err := locker.Err(); err != nil {
		t.Fatal(err)
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.NewJob(gocron.CronJob("* * * * * *", true),
		gocron.NewTask(func(ctx context.Context) {
			report("run", now(), strconv.FormatUint(gocronlock.JobHolder(ctx).Token(), 10))
		}),
		gocron.WithName(os.Getenv(ownerJob)),
		gocron.WithEventListeners(gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) {
			kind := "error"
			if errors.Is(err, lock.ErrLocked) {
				kind = "locked"
			}
			report(kind, now(), err.Error())
		})))
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	report("ready", now(), "")
	io.Copy(io.Discard, os.Stdin) // until the parent closes stdin
	mu.Lock()
	stopping = true
	mu.Unlock()
	if err := s.Shutdown(); err != nil {
		t.Error(err)
	}
	if err := locker.Close(); err != nil {
		t.Error(err)
	}
}

// An event is one line a replica reported, or its exit.
type event struct {
	r      int    // the replica, from 1
	kind   string // run, locked, error, ready, exit
	tick   int64  // the Unix second it fired in
	detail string // the run's token, or the error
}

// A replica process.
type replicaProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr bytes.Buffer
	exited chan struct{}
}

// owners is the parent's view of the cluster: every event, in order.
type owners struct {
	t      *testing.T
	procs  []*replicaProc
	events chan event
	runs   map[int64][]int // tick -> replicas that ran it
	dead   map[int]int64   // replica -> the tick it was stopped in
	seq    []string        // who ran each tick, for the log
}

func testOwner(t *testing.T, backend string) {
	var id [4]byte
	rand.Read(id[:])
	job := "owner-" + hex.EncodeToString(id[:])
	o := &owners{t: t, events: make(chan event, 1000), runs: map[int64][]int{}, dead: map[int]int64{}}
	t.Cleanup(func() {
		for _, p := range o.procs {
			p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			for i, p := range o.procs {
				t.Logf("replica r%d stderr:\n%s", i+1, p.stderr.String())
			}
		}
	})
	for r := 1; r <= 3; r++ {
		o.start(r, backend, job)
	}
	ready := 0
	o.until(30*time.Second, "three replicas ready", func(e event) bool {
		if e.kind == "ready" {
			ready++
		}
		return ready == 3
	})

	// The first owner: whoever runs the first tick, which then keeps it.
	owner := o.nextOwner(0, 10*time.Second, "a first run")
	o.keeps(owner)

	// Killed: the backend frees its lock (the lease, or the session), and
	// the next tick after that runs on another replica, which keeps it.
	o.kill(owner)
	next := o.nextOwner(owner, ownerTTL+2*time.Second+10*time.Second, fmt.Sprintf("a replica takes over from r%d, killed", owner))
	o.keeps(next)

	// Shut down cleanly: Close releases the kept lock, the last replica
	// takes the job at its next tick.
	o.stop(next)
	last := o.nextOwner(next, 2*time.Second+10*time.Second, fmt.Sprintf("the last replica takes over from r%d, stopped", next))
	o.ticks(last, 2)
	t.Logf("%s: owner of each tick: %s", backend, strings.Join(o.seq, " "))
}

// start runs replica r as a child process and forwards its reports.
func (o *owners) start(r int, backend, job string) {
	t := o.t
	cmd := testenv.Command(t, ownerRole, "TestOwnerKeepsJob", ownerBackend+"="+backend, ownerJob+"="+job)
	p := &replicaProc{cmd: cmd, exited: make(chan struct{})}
	cmd.Stderr = &p.stderr
	var err error
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	o.procs = append(o.procs, p)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var e event
			rest, ok := strings.CutPrefix(sc.Text(), ownerMark+" ")
			if !ok {
				continue // the test binary's own output
			}
			if _, err := fmt.Sscanf(rest, "%s %d %q", &e.kind, &e.tick, &e.detail); err != nil {
				e.kind, e.detail = "error", "unreadable report: "+rest
			}
			e.r = r
			o.events <- e
		}
		cmd.Wait()
		close(p.exited)
		o.events <- event{r: r, kind: "exit"}
	}()
}

// until reads events until stop returns true, failing the test if that
// takes longer than d (a guard against a hang, not a timing target).
// Every event is checked on the way: a tick runs at most once, a run
// comes from a live replica, and a Lock error is contention.
func (o *owners) until(d time.Duration, what string, stop func(e event) bool) {
	o.t.Helper()
	deadline := time.After(d)
	for {
		select {
		case e := <-o.events:
			o.check(e)
			if stop(e) {
				return
			}
		case <-deadline:
			o.t.Fatalf("%s: not within %v; owner of each tick so far: %s", what, d, strings.Join(o.seq, " "))
		}
	}
}

func (o *owners) check(e event) {
	t := o.t
	t.Helper()
	switch e.kind {
	case "run":
		if prev := o.runs[e.tick]; len(prev) > 0 {
			t.Errorf("tick %d ran twice: on r%v and on r%d", e.tick, prev, e.r)
		}
		if at, ok := o.dead[e.r]; ok && e.tick > at {
			t.Errorf("r%d ran tick %d after it was stopped in tick %d", e.r, e.tick, at)
		}
		o.runs[e.tick] = append(o.runs[e.tick], e.r)
		o.seq = append(o.seq, fmt.Sprintf("%d:r%d", e.tick%100, e.r))
	case "error":
		t.Errorf("r%d, tick %d: a Lock error that is not contention: %s", e.r, e.tick, e.detail)
	case "exit":
		if _, ok := o.dead[e.r]; !ok {
			t.Errorf("r%d exited unasked:\n%s", e.r, o.procs[e.r-1].stderr.String())
		}
	}
}

// nextOwner waits for a run by a replica other than prev, and returns it.
func (o *owners) nextOwner(prev int, d time.Duration, what string) int {
	o.t.Helper()
	next := 0
	o.until(d, what, func(e event) bool {
		if e.kind == "run" && e.r != prev {
			next = e.r
		}
		return next != 0
	})
	return next
}

// keeps checks that owner runs ownerTicks more consecutive ticks, and is
// the only one to run any, while every other live replica fires for them
// and meets the kept lock.
func (o *owners) keeps(owner int) { o.ticks(owner, ownerTicks) }

// ticks checks that owner runs n more consecutive ticks and nobody else
// runs any. It returns once every other live replica has also fired for
// the last of them and met the lock: a replica stopped then leaves no
// tick that another could still run again (the guide's caveat on a
// replica that goes away just after a run).
func (o *owners) ticks(owner, n int) {
	t := o.t
	t.Helper()
	ran := o.lastRun(owner)
	left := n
	met := map[int64]map[int]bool{} // tick -> the replicas that met the lock
	metAll := func(tick int64) bool {
		for r := 1; r <= len(o.procs); r++ {
			if _, gone := o.dead[r]; r != owner && !gone && !met[tick][r] {
				return false
			}
		}
		return true
	}
	o.until(time.Duration(n)*time.Second+10*time.Second, fmt.Sprintf("r%d runs %d ticks, the others meet its lock", owner, n), func(e event) bool {
		switch {
		case e.kind == "locked":
			if met[e.tick] == nil {
				met[e.tick] = map[int]bool{}
			}
			met[e.tick][e.r] = true
		case e.kind == "run" && e.r != owner:
			t.Fatalf("tick %d ran on r%d while r%d, its owner, was alive; owner of each tick: %s", e.tick, e.r, owner, strings.Join(o.seq, " "))
		case e.kind == "run":
			if ran != 0 && e.tick != ran+1 {
				t.Errorf("r%d ran tick %d after tick %d: the ticks between did not run", owner, e.tick, ran)
			}
			ran = e.tick
			left--
		}
		return left <= 0 && metAll(ran)
	})
}

// lastRun is the latest tick r ran.
func (o *owners) lastRun(r int) int64 {
	var last int64
	for tick, rs := range o.runs {
		if rs[0] == r && tick > last {
			last = tick
		}
	}
	return last
}

// kill ends replica r with SIGKILL, as a crash would.
func (o *owners) kill(r int) {
	o.dead[r] = time.Now().Truncate(time.Second).Unix()
	if err := o.procs[r-1].cmd.Process.Kill(); err != nil {
		o.t.Fatal(err)
	}
}

// stop shuts replica r down cleanly (its scheduler, then its Locker) and
// waits for it to exit.
func (o *owners) stop(r int) {
	t := o.t
	t.Helper()
	o.dead[r] = time.Now().Add(time.Second).Truncate(time.Second).Unix() // it may still run the current tick
	o.procs[r-1].stdin.Close()
	o.until(20*time.Second, fmt.Sprintf("r%d exits", r), func(e event) bool { return e.kind == "exit" && e.r == r })
	if ps := o.procs[r-1].cmd.ProcessState; ps != nil && !ps.Success() {
		t.Errorf("r%d: %v:\n%s", r, ps, o.procs[r-1].stderr.String())
	}
}
