package tests

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ubgo/lock"
	"github.com/ubgo/lock/internal/testenv"
	"github.com/ubgo/lock/redislock"
)

// Leader election on Redis with real processes: candidates are this test
// binary run again (role "redis-candidate"), each running lock.Lead on a
// redislock factory of its own. The leader is SIGKILLed, another is SIGSTOPped
// past its lease, and every write goes through the durable redislock Fence
// with the leader's epoch.

const (
	candidateTTL   = time.Second
	candidateRetry = 200 * time.Millisecond
	// takeoverSlack is added to TTL + retry for process scheduling on a
	// small, noisy machine (and the race detector).
	takeoverSlack = 5 * time.Second
)

// TestRedisCandidate is the child process: a leader candidate. It reports
// "@@ LEADER <epoch>" when elected and "@@ STEPPED <epoch> <lost>" when its
// term ends, and on each "write" line from stdin writes through the fence
// with the epoch of its latest term: "@@ WRITE <epoch> ok|stale|err ...".
// It ends when stdin closes.
func TestRedisCandidate(t *testing.T) {
	if testenv.Child() != "redis-candidate" {
		t.Skip("runs only as a child process of TestRedisLeaderKilled")
	}
	prefix, name, id := os.Getenv("LEADER_PREFIX"), os.Getenv("LEADER_NAME"), os.Getenv("LEADER_ID")
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer rdb.Close()
	f := redislock.NewFactory(rdb, redislock.WithKeyPrefix(prefix), redislock.WithTTL(candidateTTL), redislock.WithLogger(nil))
	defer f.Close()
	fence := redislock.NewFence(rdb, redislock.WithKeyPrefix(prefix))

	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf("@@ "+format+"\n", args...)
	}
	var epoch atomic.Uint64
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			if sc.Text() != "write" {
				continue
			}
			// The write of a leader that may have been deposed while it
			// was paused: it carries the epoch it was elected with, and
			// does not ask the lock first.
			e := epoch.Load()
			wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := fence.RejectIfStale(wctx, name, e)
			wcancel()
			switch {
			case err == nil:
				say("WRITE %d ok", e)
			case errors.Is(err, lock.ErrStaleToken):
				say("WRITE %d stale", e)
			default:
				say("WRITE %d err %v", e, err)
			}
		}
		cancel()
	}()
	err := lock.Lead(ctx, f.AsLocker(redislock.WithOwner(id)), name, func(ctx context.Context, e uint64) error {
		epoch.Store(e)
		say("LEADER %d", e)
		<-ctx.Done()
		say("STEPPED %d %v", e, errors.Is(context.Cause(ctx), lock.ErrLockLost))
		return nil
	}, lock.WithLeadRetry(candidateRetry), lock.WithLeadLogger(nil))
	if !errors.Is(err, context.Canceled) {
		say("ERR %v", err)
	}
}

type candidate struct {
	id    string
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

type candidateLine struct {
	c    *candidate
	text string
}

func TestRedisLeaderKilled(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	t.Cleanup(func() { rdb.Close() })
	testenv.Need(t, "redis", func(ctx context.Context) error { return rdb.Ping(ctx).Err() })
	prefix := fmt.Sprintf("tests-leader:%x:", time.Now().UnixNano())
	t.Cleanup(func() {
		// The fence record never expires: remove what this run wrote.
		ctx := context.Background()
		iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
	})
	const name = "leader"
	inspector := redislock.NewFactory(rdb, redislock.WithKeyPrefix(prefix), redislock.WithLogger(nil))
	defer inspector.Close()

	lines := make(chan candidateLine, 256)
	var cands []*candidate
	for i := range 3 {
		c := &candidate{id: fmt.Sprint("candidate-", i)}
		c.cmd = testenv.Command(t, "redis-candidate", "TestRedisCandidate",
			"LEADER_PREFIX="+prefix, "LEADER_NAME="+name, "LEADER_ID="+c.id)
		c.cmd.Stderr = os.Stderr
		var err error
		if c.stdin, err = c.cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		out, err := c.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			testenv.Resume(c.cmd.Process)
			c.cmd.Process.Kill()
			c.cmd.Wait()
		})
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if l, ok := strings.CutPrefix(sc.Text(), "@@ "); ok {
					lines <- candidateLine{c, l}
				}
			}
		}()
		cands = append(cands, c)
	}

	// next returns the next line that starts with prefix (from c, if not
	// nil), failing on a child's ERR line or after d.
	// Lines not asked for yet are kept: a resumed leader's STEPPED and
	// WRITE lines come in either order.
	var pending []candidateLine
	next := func(c *candidate, prefix string, d time.Duration) candidateLine {
		t.Helper()
		match := func(l candidateLine) bool { return strings.HasPrefix(l.text, prefix) && (c == nil || l.c == c) }
		for i, l := range pending {
			if match(l) {
				pending = append(pending[:i], pending[i+1:]...)
				return l
			}
		}
		deadline := time.After(d)
		for {
			select {
			case l := <-lines:
				t.Logf("%s: %s", l.c.id, l.text)
				if strings.HasPrefix(l.text, "ERR") || strings.Contains(l.text, " err ") {
					t.Fatalf("%s: %s", l.c.id, l.text)
				}
				if match(l) {
					return l
				}
				pending = append(pending, l)
			case <-deadline:
				t.Fatalf("no %q within %v", prefix, d)
			}
		}
	}
	elected := func(d time.Duration) (*candidate, uint64) {
		t.Helper()
		l := next(nil, "LEADER ", d)
		e, err := strconv.ParseUint(strings.TrimPrefix(l.text, "LEADER "), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return l.c, e
	}
	write := func(c *candidate, epoch uint64, want string) {
		t.Helper()
		if _, err := io.WriteString(c.stdin, "write\n"); err != nil {
			t.Fatal(err)
		}
		l := next(c, "WRITE ", 20*time.Second)
		if l.text != fmt.Sprintf("WRITE %d %s", epoch, want) {
			t.Fatalf("%s: %q; want %q", c.id, l.text, fmt.Sprintf("WRITE %d %s", epoch, want))
		}
	}
	leads := func(c *candidate) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		who, ok, err := lock.CurrentLeader(ctx, inspector, name)
		if err != nil || !ok || who.Owner != c.id {
			t.Fatalf("CurrentLeader = %+v %v %v; want %s", who, ok, err, c.id)
		}
	}
	bound := candidateTTL + candidateRetry + takeoverSlack

	first, e1 := elected(30 * time.Second)
	leads(first)
	write(first, e1, "ok")

	// The leader dies: its lease runs out and another candidate is elected.
	killed := time.Now()
	if err := first.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	second, e2 := elected(bound)
	t.Logf("leaderless for %v after SIGKILL (TTL %v + retry %v)", time.Since(killed).Round(time.Millisecond), candidateTTL, candidateRetry)
	if second == first || e2 <= e1 {
		t.Fatalf("after the kill: %s with epoch %d, before %s with %d", second.id, e2, first.id, e1)
	}
	leads(second)
	write(second, e2, "ok")

	// The new leader is paused past its lease: the third one takes over
	// and writes, and the paused one's write, once it runs again, is refused.
	testenv.Pause(t, second.cmd.Process)
	stopped := time.Now()
	third, e3 := elected(bound)
	t.Logf("leaderless for %v after SIGSTOP", time.Since(stopped).Round(time.Millisecond))
	if third == first || third == second || e3 <= e2 {
		t.Fatalf("after the pause: %s with epoch %d, before %s with %d", third.id, e3, second.id, e2)
	}
	leads(third)
	write(third, e3, "ok")
	if err := testenv.Resume(second.cmd.Process); err != nil {
		t.Fatal(err)
	}
	write(second, e2, "stale")
	// Resumed, the deposed leader learns of the loss and steps down.
	if l := next(second, "STEPPED ", 20*time.Second); l.text != fmt.Sprintf("STEPPED %d true", e2) {
		t.Fatalf("%s: %q; want its term %d ended by a loss", second.id, l.text, e2)
	}
	leads(third)
	write(third, e3, "ok")

	for _, c := range cands {
		c.stdin.Close()
	}
}
