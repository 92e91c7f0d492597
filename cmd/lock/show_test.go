//go:build unix

package main

import (
	"strings"
	"testing"
)

// On every backend, ls lists the held names under a prefix with their
// owners and tokens, as a table and as JSON lines, and inspect shows one
// name, held or free.
func TestInspectAndList(t *testing.T) {
	for _, be := range backends {
		t.Run(be.kind, func(t *testing.T) {
			url, prefix := be.url(t), uniqueName(t)
			tokA, _ := holdLock(t, url, prefix+"-a", "--owner", "owner-a")
			tokB, _ := holdLock(t, url, prefix+"-b", "--owner", "owner-b")
			want := map[string][2]string{prefix + "-a": {tokA, "owner-a"}, prefix + "-b": {tokB, "owner-b"}}

			r := runLock(t, "ls", "--backend", url, prefix)
			r.want(t, 0, "ls")
			lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
			if len(lines) != 3 || !strings.HasPrefix(lines[0], "NAME ") {
				t.Fatalf("ls: want a header and two rows, got:\n%s", r.stdout)
			}
			// Aligned: every column starts where the header's does.
			col := strings.Index(lines[0], "TOKEN")
			for _, line := range lines[1:] {
				f := strings.Fields(line)
				w, ok := want[f[0]]
				if !ok || f[2] != w[0] || f[3] != w[1] || strings.Index(line, w[0]) != col {
					t.Errorf("ls row %q, want name, limit 1, token %s, owner %s in aligned columns", line, w[0], w[1])
				}
			}

			r = runLock(t, "ls", "--backend", url, "--json", prefix)
			r.want(t, 0, "ls --json")
			lines = strings.Split(strings.TrimSpace(r.stdout), "\n")
			if len(lines) != 2 {
				t.Fatalf("ls --json: want two lines, got:\n%s", r.stdout)
			}
			for _, line := range lines {
				var info jsonInfo
				decode(t, line, &info)
				w, ok := want[info.Name]
				if !ok || info.Limit != 1 || len(info.Holders) != 1 || info.Holders[0].Token != mustUint(t, w[0]) || info.Holders[0].Owner != w[1] {
					t.Errorf("ls --json: %s, want %s held by %v", line, info.Name, w)
				}
			}

			r = runLock(t, "inspect", "--backend", url, prefix+"-a")
			r.want(t, 0, "inspect")
			if !strings.Contains(r.stdout, "owner-a") || !strings.Contains(r.stdout, tokA) {
				t.Errorf("inspect:\n%s\nwant owner-a with token %s", r.stdout, tokA)
			}
			free := inspectJSON(t, url, prefix+"-free")
			if free.Name != prefix+"-free" || len(free.Holders) != 0 {
				t.Errorf("inspect of a free name: %+v", free)
			}
			if r := runLock(t, "ls", "--backend", url, prefix+"-none"); r.code != 0 || r.stdout != "" {
				t.Errorf("ls of a prefix nobody holds:\n%s", r.stdout)
			}
		})
	}
}

// --key-prefix reaches the backend: a name held under one prefix is free
// under the default.
func TestKeyPrefix(t *testing.T) {
	url, name := redisURL(t), uniqueName(t)
	holdLock(t, url, name, "--key-prefix", "cmdtest:")
	if info := inspectJSON(t, url, name, "--key-prefix", "cmdtest:"); len(info.Holders) != 1 {
		t.Errorf("inspect under the prefix: %+v, want one holder", info)
	}
	if info := inspectJSON(t, url, name); len(info.Holders) != 0 {
		t.Errorf("inspect under the default prefix: %+v, want none", info)
	}
}

// break refuses on flock and pglock, whose locks end only with their
// holder, saying why, before it asks anything, and leaves the lock alone.
func TestBreakRefuses(t *testing.T) {
	for _, be := range backends {
		if be.kind != "flock" && be.kind != "pglock" {
			continue
		}
		t.Run(be.kind, func(t *testing.T) {
			url, name := be.url(t), uniqueName(t)
			holdLock(t, url, name)
			r := runLock(t, "break", "--backend", url, name)
			r.want(t, exitRefused, "break")
			if !strings.Contains(r.stderr, "refused: "+be.kind) && !strings.Contains(r.stderr, "refused: a "+be.kind) {
				t.Errorf("break: stderr %q does not say why %s refuses", r.stderr, be.kind)
			}
			if info := inspectJSON(t, url, name); len(info.Holders) != 1 {
				t.Errorf("after a refused break: %+v, want the lock still held", info)
			}
		})
	}
}
