//go:build !linux

package dirwatch

// watch is unavailable here: waiters poll.
type watch struct{}

func start(string) *watch { return nil }

func (*watch) stop() {}
