//go:build unix

package main

import (
	"fmt"
	"os"
)

// lock run on a flock directory: the command sees the lock's name in its
// environment, and its exit status is lock's.
func Example() {
	dir, _ := os.MkdirTemp("", "lock-example")
	defer os.RemoveAll(dir)
	code := lockMain([]string{"run", "--backend", "flock://" + dir, "nightly", "--",
		"sh", "-c", `echo "running $LOCK_NAME"; exit 3`}, os.Stdin, os.Stdout, os.Stderr)
	fmt.Println("exit", code)
	// Output:
	// running nightly
	// exit 3
}
