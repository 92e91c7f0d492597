//go:build !unix

// Command lock runs a command under a named lock. It needs process groups
// and signals, so it is built for unix systems only.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "lock: this command runs on unix systems only")
	os.Exit(70)
}
