//go:build unix

package filelock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ubgo/lock"
	"github.com/ubgo/lock/backend"
)

// Fence is a lock.Fence kept in files: one file per fenced key,
// <dir>/fence/<escaped key>.token, in the format of a lock's counter file
// ("token=N", "limit=0", and a CRC). RejectIfStale takes the file's flock
// (the same short guard a lock's counter file gets, shared in-process by a
// queue), reads the token, compares, and rewrites and fsyncs the file
// before it lets go; the first record of a key also fsyncs the directory.
// Check and record are therefore one step for every process on the host,
// or on hosts whose shared file system honours flock.
//
// A record that fails its CRC (a torn write after a crash, a hand edit) is
// not guessed at: calls for that key fail with an error until an operator
// restores it. A fence that forgot would let a stale writer in.
type Fence struct{ st *store }

// Ledger is a lock.Ledger kept in files: one file per recorded key,
// <dir>/done/<escaped key>.done, whose existence is the record (its content,
// key, token and time, is for operators). MarkDone writes and fsyncs a
// temporary file, link(2)s it to the record's name — which fails if the
// record exists, so the first one wins — and fsyncs the directory. IsDone
// is a stat. An operator re-runs a key's work by deleting its file.
type Ledger struct{ st *store }

// NewFence returns a fence under the directory of WithDir (default
// DefaultDir(), the locks' default), created on first use. Other options
// are accepted and ignored, so a factory's options can be passed as they
// are. An invalid option is reported by the first call.
func NewFence(opts ...Option) *Fence {
	return &Fence{st: newStore("fence", opts)}
}

// NewLedger returns a ledger under the directory of WithDir, like NewFence.
func NewLedger(opts ...Option) *Ledger {
	return &Ledger{st: newStore("done", opts)}
}

// store is the directory of a Fence or Ledger: <dir>/sub. A subdirectory
// cannot meet a lock's files, whose names all contain a '.'.
type store struct {
	dir string // <dir>/fence or <dir>/done, absolute
	err error
}

func newStore(sub string, opts []Option) *store {
	o, err := lock.Apply(backend.Options(backendName), opts...)
	if err != nil {
		return &store{err: err}
	}
	abs, err := filepath.Abs(cmp.Or(o.Dir, DefaultDir()))
	if err != nil {
		return &store{err: fmt.Errorf("filelock: directory: %w", err)}
	}
	return &store{dir: filepath.Join(abs, sub)}
}

// Path returns the file that holds key's fence record.
func (f *Fence) Path(key string) string { return counterPath(f.st.dir, backend.Escape(key)) }

// Path returns the file that is key's ledger record.
func (l *Ledger) Path(key string) string { return l.st.dir + "/" + backend.Escape(key) + ".done" }

// RejectIfStale records token as the highest for key, or returns an error
// matching lock.ErrStaleToken, recording nothing, if a higher token is
// recorded or token is 0.
func (f *Fence) RejectIfStale(ctx context.Context, key string, token uint64) error {
	return f.Apply(ctx, key, token, nil)
}

// Apply runs write only if token is not stale for key, and holds key's
// fence while write runs, so that no other write fenced under key in this
// directory can come between the check and the write. The token is
// recorded, durably, before write runs, and stays recorded if write fails:
// it was a real holder's, so every lower token is stale anyway. write
// should be short; other writers of key wait for it.
func (f *Fence) Apply(ctx context.Context, key string, token uint64, write func() error) error {
	if err := backend.CheckStore(ctx, f.st.err, key); err != nil {
		return err
	}
	if token == 0 {
		return fmt.Errorf("filelock: %w: %q: token 0 is never issued to a holder", lock.ErrStaleToken, key)
	}
	if err := ensureDir(f.st.dir); err != nil {
		return err
	}
	esc := backend.Escape(key)
	g, err := lockGuard(ctx, f.st.dir, esc)
	if err != nil {
		return err
	}
	defer g.unlock()
	var st unix.Stat_t
	if err := unix.Fstat(g.fd, &st); err != nil {
		return fmt.Errorf("filelock: fence: %w", err)
	}
	fresh := st.Size == 0
	var highest uint64
	if !fresh {
		c := readCounter(g.fd)
		if !c.valid {
			return fmt.Errorf("filelock: fence record %s is corrupt: restore it (token=<at least the highest token ever used>) or remove it knowingly", counterPath(f.st.dir, esc))
		}
		highest = c.token
	}
	if token < highest {
		return fmt.Errorf("filelock: %w: %q: token %d is below %d", lock.ErrStaleToken, key, token, highest)
	}
	if token > highest {
		if err := writeCounter(g.fd, token, 0, 0); err != nil {
			return fmt.Errorf("filelock: fence: %w", err)
		}
		if fresh {
			if err := syncDir(f.st.dir); err != nil {
				return err
			}
		}
	}
	if write == nil {
		return nil
	}
	return write()
}

// IsDone reports whether key is recorded.
func (l *Ledger) IsDone(ctx context.Context, key string) (bool, error) {
	if err := backend.CheckStore(ctx, l.st.err, key); err != nil {
		return false, err
	}
	var st unix.Stat_t
	switch err := unix.Stat(l.Path(key), &st); err {
	case nil:
		return true, nil
	case unix.ENOENT:
		return false, nil
	default:
		return false, fmt.Errorf("filelock: ledger: %w", err)
	}
}

// MarkDone records key as done by token, unless it already is: the first
// record wins and a repeated call changes nothing.
func (l *Ledger) MarkDone(ctx context.Context, key string, token uint64) error {
	if err := backend.CheckStore(ctx, l.st.err, key); err != nil {
		return err
	}
	if err := ensureDir(l.st.dir); err != nil {
		return err
	}
	esc := backend.Escape(key)
	tmp := tempPath(l.st.dir, esc, newNonce())
	body := "key=" + quote(key, false) + "\ntoken=" + strconv.FormatUint(token, 10) +
		"\ndone_at=" + time.Now().UTC().Format(time.RFC3339Nano) + "\n"
	err := writeTemp(tmp, []byte(body))
	if errors.Is(err, unix.ENOENT) {
		// The directory was removed since this process made it.
		madeDirs.Delete(l.st.dir)
		if err := ensureDir(l.st.dir); err != nil {
			return err
		}
		err = writeTemp(tmp, []byte(body))
	}
	if err != nil {
		return fmt.Errorf("filelock: ledger: %w", err)
	}
	err = unix.Link(tmp, l.Path(key))
	unix.Unlink(tmp)
	if err != nil && err != unix.EEXIST {
		return fmt.Errorf("filelock: ledger: %w", err)
	}
	// Also after EEXIST: the process that linked the record may not have
	// synced the directory yet, and ours must not report a record that a
	// crash could still take back.
	return syncDir(l.st.dir)
}

// madeDirs are the store directories this process has created or found,
// and made durable.
var madeDirs sync.Map

// ensureDir creates dir, and syncs its parent so that the new entry
// survives a crash, once per process.
func ensureDir(dir string) error {
	if _, ok := madeDirs.Load(dir); ok {
		return nil
	}
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return fmt.Errorf("filelock: directory: %w", err)
	}
	if err := syncDir(filepath.Dir(dir)); err != nil {
		return err
	}
	madeDirs.Store(dir, true)
	return nil
}

// syncDir makes the entries of dir (a file linked or created in it) durable.
func syncDir(dir string) error {
	fd, err := open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err == nil {
		err = unix.Fsync(fd)
		unix.Close(fd)
	}
	if err != nil {
		return fmt.Errorf("filelock: sync %s: %w", dir, err)
	}
	return nil
}
