//go:build unix && !linux

package main

import "syscall"

// childAttr puts the command in a process group of its own, so that
// signals reach everything it starts. (There is no parent-death signal
// here: a command whose lock process is killed runs on.)
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
