package main

import "syscall"

// childAttr puts the command in a process group of its own, so that
// signals reach everything it starts, and kills it if lock itself dies
// (SIGKILL included), so that it never runs on without the lock.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
