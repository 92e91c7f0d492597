// Package chaos is the family's fault-injection suite: a test-only module
// whose dependencies (a TCP fault proxy, the porcupine linearizability
// checker, every backend's driver) never reach users.
//
// For each backend it runs several real client processes (the test binary
// started again) that loop acquire, read-modify-write a fenced register,
// release, while faults are injected on a seeded schedule: SIGKILL and
// SIGSTOP of holders and of waiters, server restarts, dropped and stalled
// connections, cancelled waits; TestPausedWaiter, in rounds, stops a
// queued waiter across the release that grants it the name. The
// histories the clients and the register write are checked after the
// run: fencing, linearizability, overlap of critical sections, stale
// grants, lost updates, recovery time, loss notification.
//
// `go test` runs a short seeded version of every backend; `make chaos`
// (CHAOS_LONG=1) runs each for longer and prints a table per backend.
// docs/design/chaos.md describes the method, the faults and the checks.
// The suite runs on Linux only (CLOCK_MONOTONIC shared by processes,
// SIGSTOP, flock, Pdeathsig).
package chaos
