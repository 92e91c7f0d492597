//go:build unix && !linux

package filelock

import (
	"os"
	"sync"
	"time"
)

// identity is what a marker records about the process that wrote it.
type identity struct {
	pid    int
	ticks  uint64
	start  time.Time
	host   string
	bootID string
	pidNS  string
	timeNS string
}

var self = sync.OnceValue(func() identity {
	id := identity{pid: os.Getpid()}
	id.host, _ = os.Hostname()
	return id
})

// holderGone cannot prove a holder dead without /proc: start times are not
// known, so a reused PID would look alive. Markers are left to their stale
// window.
func holderGone(*marker) bool { return false }
