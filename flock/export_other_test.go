//go:build !linux

package flock

// BoardWaiters is 0: there is no board here (waiters poll).
func BoardWaiters(dir, name string) uint32 { return 0 }
