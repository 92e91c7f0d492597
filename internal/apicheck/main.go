// Command apicheck compares the exported API of every module of the
// repository with the last release, and fails on an incompatible change
// that CHANGELOG.md does not announce. scripts/test.sh (make test) runs
// it from the top of the repository:
//
//	go run ./internal/apicheck [-C DIR] [-against TAG]
//
// The last release is the highest tag vX.Y.Z (or vX.Y.Z-pre) in HEAD's
// history, or -against. A module is compared if that release tagged it
// (VERSION for the root, DIR/VERSION for the module in DIR): modules that
// are not published, and modules added since, have no released API to
// keep. The old side is the tree at the tag, the new side the work tree,
// uncommitted changes included. Internal packages and commands (package
// main) are no API. The comparison is golang.org/x/exp/cmd/apidiff at the
// version pinned in apidiffVersion, installed with go install into a
// temporary directory.
//
// An incompatible change is announced by a bullet under "### Breaking" in
// the "## [Unreleased]" section of CHANGELOG.md that names the package by
// its import path and the identifier as apidiff names it, a method's
// receiver written without "(*...)", for example
//
//	### Breaking
//
//	- `github.com/ubgo/lock/memlock`: `Holder.Extend` takes a context.
//
// A bullet may wrap over several lines and name several identifiers. A
// removed package is announced by a bullet naming its import path.
//
// Without a release tag in HEAD's history there is nothing to compare
// against: apicheck says so and succeeds.
//
// Exit status: 0 when every incompatible change is announced, 1 when one
// is not, 2 when the check could not run.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// apidiffVersion is the golang.org/x/exp that apicheck runs apidiff from.
const apidiffVersion = "v0.0.0-20261113113407-e3970619a1a4"

func main() {
	dir := flag.String("C", ".", "the repository's work tree")
	against := flag.String("against", "", "the release tag to compare with (default: the last in HEAD's history)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: apicheck [-C DIR] [-against TAG]\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}
	os.Exit(run(*dir, *against, os.Stdout))
}

// run does the check and returns the exit status.
func run(dir, against string, out io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "apicheck: %v\n", err)
		return 2
	}
	repo, err := gitOut(dir, "rev-parse", "--show-toplevel")
	if err != nil {
		return fail(err)
	}
	tag := against
	if tag == "" {
		if tag, err = lastRelease(repo); err != nil {
			return fail(err)
		}
		if tag == "" {
			fmt.Fprintln(out, "apicheck: no release tag (vX.Y.Z) in HEAD's history: no released API to compare with")
			return 0
		}
	}
	tmp, err := os.MkdirTemp("", "apicheck")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(tmp)
	c := &checker{repo: repo, tag: tag, tmp: tmp, out: out}
	changes, err := c.changes()
	if err != nil {
		return fail(err)
	}
	breaking, err := readBreaking(filepath.Join(repo, "CHANGELOG.md"))
	if err != nil {
		return fail(err)
	}
	return report(out, tag, changes, breaking)
}

// report prints the incompatible changes, announced or not, and returns
// the exit status.
func report(out io.Writer, tag string, changes []change, breaking []string) int {
	var missing []change
	for _, ch := range changes {
		if announced(breaking, ch) {
			fmt.Fprintf(out, "apicheck: announced: %s\n", ch)
		} else {
			missing = append(missing, ch)
		}
	}
	if len(missing) == 0 {
		if len(changes) == 0 {
			fmt.Fprintf(out, "apicheck: the API is compatible with %s\n", tag)
		} else {
			fmt.Fprintf(out, "apicheck: the API is compatible with %s, but for the %d change(s) CHANGELOG.md announces\n", tag, len(changes))
		}
		return 0
	}
	for _, ch := range missing {
		fmt.Fprintf(out, "apicheck: not announced: %s\n", ch)
	}
	fmt.Fprintf(out, "apicheck: %d incompatible change(s) since %s not named in CHANGELOG.md: add a bullet under \"### Breaking\" in the Unreleased section naming the package's import path and the identifier (CONTRIBUTING.md, API stability), or keep the API\n", len(missing), tag)
	return 1
}
