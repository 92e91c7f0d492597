//go:build unix

package filelock

import (
	"os"
	"path/filepath"
	"sync"

	"github.com/ubgo/lock/backend"
	"github.com/ubgo/lock/internal/dirwatch"
)

// syncHook is what SetSyncHook installs; the wrapper below is in place for
// the whole test binary, so tests never write syncFile itself while another
// goroutine may be calling it.
var syncHook struct {
	sync.Mutex
	fn func(path string) error
}

func init() {
	next := syncFile
	syncFile = func(path string, f *os.File) error {
		syncHook.Lock()
		fn := syncHook.fn
		syncHook.Unlock()
		if fn != nil {
			if err := fn(path); err != nil {
				return err
			}
		}
		return next(path, f)
	}
}

// SetSyncHook makes every sync of a marker being written (the temporary
// file of an acquire or a refresh, by path) call fn first: fn may block to
// stall the disk, or return an error to fail the sync. nil removes it.
func SetSyncHook(fn func(path string) error) {
	syncHook.Lock()
	syncHook.fn = fn
	syncHook.Unlock()
}

// Waiting is how many Acquires of this process wait on name in dir, so
// tests can act once a waiter waits.
func Waiting(dir, name string) int {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return 0
	}
	return dirwatch.Subscribers(abs, backend.Escape(name))
}
