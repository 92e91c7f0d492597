//go:build unix

package filelock_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/filelock"
	"github.com/ubgo/lock/internal/testenv"
	"github.com/ubgo/lock/locktest"
)

func TestFenceConformance(t *testing.T) {
	dir := t.TempDir()
	locktest.RunFence(t, func(t testing.TB) lock.Fence { return filelock.NewFence(filelock.WithDir(dir)) })
}

func TestLedgerConformance(t *testing.T) {
	dir := t.TempDir()
	locktest.RunLedger(t, func(t testing.TB) lock.Ledger { return filelock.NewLedger(filelock.WithDir(dir)) })
}

// The records are files an operator can read, in subdirectories that no
// lock's files can meet, and a lock of the same name is unaffected.
func TestFenceAndLedgerFiles(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	f, l := filelock.NewFence(filelock.WithDir(dir)), filelock.NewLedger(filelock.WithDir(dir))
	name := "fence/../x y"
	if got, want := f.Path(name), filepath.Join(dir, "fence", "fence%2F%2E%2E%2Fx%20y.token"); got != want {
		t.Fatalf("fence path %q, want %q", got, want)
	}
	if got, want := l.Path(name), filepath.Join(dir, "done", "fence%2F%2E%2E%2Fx%20y.done"); got != want {
		t.Fatalf("ledger path %q, want %q", got, want)
	}
	if err := f.RejectIfStale(ctx, name, 1<<63+5); err != nil {
		t.Fatal(err)
	}
	if err := l.MarkDone(ctx, name, 42); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(f.Path(name)); err != nil || !strings.HasPrefix(string(b), "token=9223372036854775813\n") {
		t.Fatalf("fence record %q %v", b, err)
	}
	b, err := os.ReadFile(l.Path(name))
	if err != nil || !strings.HasPrefix(string(b), "key=fence/../x y\ntoken=42\ndone_at=") {
		t.Fatalf("ledger record %q %v", b, err)
	}
	if err := l.MarkDone(ctx, name, 43); err != nil {
		t.Fatal(err)
	}
	if b2, _ := os.ReadFile(l.Path(name)); string(b2) != string(b) {
		t.Fatalf("a second MarkDone changed the record: %q", b2)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "done"))
	if len(entries) != 1 {
		t.Fatalf("done/ holds %d files; the temporary file must be gone", len(entries))
	}
	fac := newFactory(t, filelock.WithDir(dir))
	for _, n := range []string{"fence", "done", name} {
		h := mustAcquire(t, fac, n)
		h.Release()
	}
	if n, err := fac.Sweep(ctx, 0); n != 0 || err != nil {
		t.Fatalf("Sweep: %d %v", n, err)
	}
	// The operator's re-run: delete the record.
	os.Remove(l.Path(name))
	if done, err := l.IsDone(ctx, name); done || err != nil {
		t.Fatalf("after removal: done %v err %v", done, err)
	}
	if p := filelock.NewFence().Path("x"); p != filepath.Join(filelock.DefaultDir(), "fence", "x.token") {
		t.Fatalf("default fence path %q", p)
	}
}

// A torn or edited record is not guessed at: the fence refuses every token
// with an error that is not ErrStaleToken, until an operator repairs it.
func TestFenceCorruptRecord(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	f := filelock.NewFence(filelock.WithDir(dir))
	if err := f.RejectIfStale(ctx, "k", 10); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.Path("k"), []byte("token=3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := f.RejectIfStale(ctx, "k", 11)
	if err == nil || errors.Is(err, lock.ErrStaleToken) || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("corrupt record: %v", err)
	}
	os.Remove(f.Path("k"))
	if err := f.RejectIfStale(ctx, "k", 11); err != nil {
		t.Fatalf("after removal: %v", err)
	}
}

// Apply holds the fence while the write runs: a stale write never runs,
// and the token is recorded even when the write fails.
func TestFenceApply(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	f := filelock.NewFence(filelock.WithDir(dir))
	boom := errors.New("boom")
	if err := f.Apply(ctx, "k", 5, func() error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("failing write: %v", err)
	}
	ran := false
	if err := f.Apply(ctx, "k", 4, func() error { ran = true; return nil }); !errors.Is(err, lock.ErrStaleToken) || ran {
		t.Fatalf("stale Apply: %v, write ran %v", err, ran)
	}
}

func TestFenceAndLedgerBadInput(t *testing.T) {
	ctx := context.Background()
	if err := filelock.NewFence(filelock.WithDir("")).RejectIfStale(ctx, "k", 1); !errors.Is(err, lock.ErrInvalidOption) {
		t.Errorf("WithDir(\"\"): %v", err)
	}
	if err := filelock.NewFence(filelock.WithDir(t.TempDir())).RejectIfStale(ctx, "a\x00b", 1); !errors.Is(err, lock.ErrInvalidName) {
		t.Errorf("NUL in key: %v", err)
	}
	if done, err := filelock.NewLedger(filelock.WithDir("")).IsDone(ctx, "k"); done || !errors.Is(err, lock.ErrInvalidOption) {
		t.Errorf("WithDir(\"\") Done: %v %v", done, err)
	}
}

// TestFenceChild is the child process of TestFenceAcrossProcesses: it
// offers random tokens to the fence and reports the highest it got accepted.
func TestFenceChild(t *testing.T) {
	if testenv.Child() != "fence-hammer" {
		t.Skip("runs only as a child process of TestFenceAcrossProcesses")
	}
	f := filelock.NewFence(filelock.WithDir(os.Getenv("FILELOCK_DIR")))
	var top uint64
	for range 150 {
		tok := uint64(rand.IntN(1000) + 2)
		err := f.RejectIfStale(context.Background(), "k", tok)
		switch {
		case err == nil:
			top = max(top, tok)
		case !errors.Is(err, lock.ErrStaleToken):
			fmt.Printf("@@ ERR %v\n", err)
			return
		}
	}
	fmt.Printf("@@ TOP %d\n", top)
}

// Processes racing on one fence: a read-then-write fence would let a lower
// token overwrite a higher one accepted by another process, and the one
// just below the highest accepted would then get through.
func TestFenceAcrossProcesses(t *testing.T) {
	dir := t.TempDir()
	type result struct {
		top uint64
		err error
	}
	results := make(chan result, 3)
	for range 3 {
		cmd := testenv.Command(t, "fence-hammer", "TestFenceChild", "FILELOCK_DIR="+dir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			defer cmd.Wait()
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if v, ok := strings.CutPrefix(sc.Text(), "@@ TOP "); ok {
					n, err := strconv.ParseUint(v, 10, 64)
					results <- result{n, err}
					return
				}
				if v, ok := strings.CutPrefix(sc.Text(), "@@ ERR "); ok {
					results <- result{0, errors.New(v)}
					return
				}
			}
			results <- result{0, fmt.Errorf("child ended without a result: %v", sc.Err())}
		}()
	}
	var top uint64
	for range 3 {
		select {
		case r := <-results:
			if r.err != nil {
				t.Fatal(r.err)
			}
			top = max(top, r.top)
		case <-time.After(60 * time.Second):
			t.Fatal("children did not finish")
		}
	}
	f := filelock.NewFence(filelock.WithDir(dir))
	if err := f.RejectIfStale(context.Background(), "k", top-1); !errors.Is(err, lock.ErrStaleToken) {
		t.Fatalf("after %d was accepted, %d got %v", top, top-1, err)
	}
	if err := f.RejectIfStale(context.Background(), "k", top); err != nil {
		t.Fatalf("the highest token %d is refused: %v", top, err)
	}
}

// Replicas of lock.RunOnce, each with its own factory and ledger.
func TestRunOnceLateReplica(t *testing.T) {
	dir := t.TempDir()
	locktest.RunOnceReplicas(t, func(t testing.TB, opts ...lock.Option) lock.Locker {
		return newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil)).AsLocker(opts...)
	}, func(t testing.TB) lock.Ledger { return filelock.NewLedger(filelock.WithDir(dir)) })
}

// Holder A, on a short lease it does not refresh (a process that hangs),
// loses its marker to B when the lease runs out; B writes through the fence
// with its larger token, and A's late write with its old token is refused.
func TestFenceStaleWriter(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fa := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil))
	fb := newFactory(t, filelock.WithDir(dir), filelock.WithLogger(nil))
	a, err := fa.Acquire(ctx, "export", filelock.WithStaleAfter(200*time.Millisecond), filelock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	locktest.RunStaleWriter(t, ctx, locktest.StaleWriter{Name: "export", A: a,
		FenceA:   filelock.NewFence(filelock.WithDir(dir)),
		FenceB:   filelock.NewFence(filelock.WithDir(dir)),
		TakeOver: func() (lock.Holder, error) { return fb.Acquire(ctx, "export", filelock.WithWait()) }})
}

// A store directory removed while the process runs is made again.
func TestLedgerDirRemoved(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	l := filelock.NewLedger(filelock.WithDir(dir))
	if err := l.MarkDone(ctx, "a", 1); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "done")); err != nil {
		t.Fatal(err)
	}
	if err := l.MarkDone(ctx, "b", 2); err != nil {
		t.Fatal(err)
	}
	if done, err := l.IsDone(ctx, "b"); !done || err != nil {
		t.Fatalf("done %v err %v", done, err)
	}
	f := filelock.NewFence(filelock.WithDir(dir))
	if err := f.RejectIfStale(ctx, "a", 1); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(filepath.Join(dir, "fence"))
	if err := f.RejectIfStale(ctx, "a", 1); err != nil {
		t.Fatal(err)
	}
}

func ExampleFence() {
	dir, _ := os.MkdirTemp("", "fence-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	fence := filelock.NewFence(filelock.WithDir(dir))

	fmt.Println(fence.RejectIfStale(ctx, "report", 7)) // the holder of token 7 writes
	err := fence.Apply(ctx, "report", 6, func() error {
		fmt.Println("never printed: token 6 is stale")
		return nil
	})
	fmt.Println(errors.Is(err, lock.ErrStaleToken))
	// Output:
	// <nil>
	// true
}

func ExampleLedger() {
	dir, _ := os.MkdirTemp("", "ledger-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	locks := filelock.NewFactory(filelock.WithDir(dir), filelock.WithLogger(nil))
	defer locks.Close()
	ledger := filelock.NewLedger(filelock.WithDir(dir))

	for range 2 { // the second call is a replica that starts late
		ran, err := lock.RunOnce(ctx, locks.AsLocker(), ledger, "migrate-v7", func(ctx context.Context) error {
			fmt.Println("migrating")
			return nil
		})
		fmt.Println(ran, err)
	}
	// Output:
	// migrating
	// true <nil>
	// false <nil>
}
