package backend

import "time"

// NextToken is the fencing token of a file backend's next acquire of a
// name (flock and filelock both use it), given stored, the highest token
// the name's files still record (0 when they are missing, truncated or
// corrupt), and now, the wall clock: stored + 1, or now in Unix
// nanoseconds when that is larger.
//
// The clock is the floor that makes tokens never go back, a host crash
// included: a counter that a crash reverted to an older content, truncated
// or tore still yields a token above every token handed out before, as
// long as the wall clock has not been set back by more than the time from
// the last acquire before the crash to the first one after. (A token above
// its clock reading needs one acquire per nanosecond, or a clock set back
// since.) So the counter need not be flushed to disk on every acquire; it
// keeps tokens increasing while the clock is set back, and a counter ahead
// of the clock is obeyed. A clock before 1970 is no floor.
func NextToken(stored uint64, now time.Time) uint64 {
	t := stored + 1
	if ns := now.UnixNano(); ns > 0 && uint64(ns) > t {
		t = uint64(ns)
	}
	return t
}
