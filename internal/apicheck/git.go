package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// semverTag is a release tag of the root module.
var semverTag = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$`)

// lastRelease returns the highest release tag in HEAD's history, "" if
// there is none. versionsort.suffix puts v1.2.0-rc.1 before v1.2.0.
func lastRelease(repo string) (string, error) {
	out, err := gitOut(repo, "-c", "versionsort.suffix=-", "tag", "-l", "v*", "--merged", "HEAD", "--sort=-v:refname")
	if err != nil {
		return "", err
	}
	for _, tag := range strings.Fields(out) {
		if semverTag.MatchString(tag) {
			return tag, nil
		}
	}
	return "", nil
}

func tagExists(repo, tag string) (bool, error) {
	err := exec.Command("git", "-C", repo, "rev-parse", "-q", "--verify", "refs/tags/"+tag).Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return false, nil
	}
	return err == nil, err
}

// extract writes the tree of rev into dir.
func extract(repo, rev, dir string) error {
	out, err := exec.Command("git", "-C", repo, "archive", "--format=tar", rev).Output()
	if err != nil {
		return fmt.Errorf("git archive %s: %v", rev, err)
	}
	tr := tar.NewReader(bytes.NewReader(out))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Join(dir, filepath.FromSlash(h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(name, 0o755)
		case tar.TypeReg:
			if err = os.MkdirAll(filepath.Dir(name), 0o755); err == nil {
				var data []byte
				if data, err = io.ReadAll(tr); err == nil {
					err = os.WriteFile(name, data, 0o644)
				}
			}
		case tar.TypeSymlink:
			if err = os.MkdirAll(filepath.Dir(name), 0o755); err == nil {
				err = os.Symlink(h.Linkname, name)
			}
		}
		if err != nil {
			return err
		}
	}
}

func gitOut(dir string, args ...string) (string, error) {
	out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return "", fmt.Errorf("git %s: %v\n%s", strings.Join(args, " "), err, exit.Stderr)
		}
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}
