package main

import (
	"slices"
	"testing"
)

const changelog = "# Changelog\n\n" +
	"## [Unreleased]\n\n" +
	"### Added\n\n" +
	"- `github.com/ubgo/lock/memlock`: `WithGone` is new (not a break).\n\n" +
	"### Breaking\n\n" +
	"- `github.com/ubgo/lock/memlock`: `Holder.Extend` takes a context,\n" +
	"  and `WithOld` is removed.\n" +
	"* github.com/ubgo/lock/backend removed.\n" +
	"- `github.com/ubgo/lock.ErrFoo` renamed `ErrBar`.\n\n" +
	"### Fixed\n\n" +
	"- `github.com/ubgo/lock/flock`: `New` (not a break).\n\n" +
	"## [0.1.0] - 2026-11-01\n\n" +
	"### Breaking\n\n" +
	"- `github.com/ubgo/lock/pglock`: `WithTable` removed (released).\n"

func TestBreakingBullets(t *testing.T) {
	got := breakingBullets(changelog)
	want := []string{
		"`github.com/ubgo/lock/memlock`: `Holder.Extend` takes a context, and `WithOld` is removed.",
		"github.com/ubgo/lock/backend removed.",
		"`github.com/ubgo/lock.ErrFoo` renamed `ErrBar`.",
	}
	if !slices.Equal(got, want) {
		t.Errorf("breakingBullets:\n%q\nwant\n%q", got, want)
	}
}

func TestAnnounced(t *testing.T) {
	bullets := breakingBullets(changelog)
	for _, c := range []struct {
		ch   change
		want bool
	}{
		{change{Pkg: "github.com/ubgo/lock/memlock", Name: "(*Holder).Extend"}, true},
		{change{Pkg: "github.com/ubgo/lock/memlock", Name: "WithOld"}, true},
		{change{Pkg: "github.com/ubgo/lock/backend"}, true},
		{change{Pkg: "github.com/ubgo/lock", Name: "ErrFoo"}, true},
		// Named outside Breaking, or in a released section.
		{change{Pkg: "github.com/ubgo/lock/memlock", Name: "WithGone"}, false},
		{change{Pkg: "github.com/ubgo/lock/flock", Name: "New"}, false},
		{change{Pkg: "github.com/ubgo/lock/pglock", Name: "WithTable"}, false},
		// The root package is not named by its sub-packages' paths.
		{change{Pkg: "github.com/ubgo/lock", Name: "Holder"}, false},
		{change{Pkg: "github.com/ubgo/lock", Name: "WithOld"}, false},
		// A whole word only.
		{change{Pkg: "github.com/ubgo/lock/memlock", Name: "Extend"}, true},
		{change{Pkg: "github.com/ubgo/lock/memlock", Name: "With"}, false},
		{change{Pkg: "github.com/ubgo/lock/mem"}, false},
	} {
		if got := announced(bullets, c.ch); got != c.want {
			t.Errorf("announced(%s) = %v, want %v", c.ch, got, c.want)
		}
	}
}

func TestPlainName(t *testing.T) {
	for in, want := range map[string]string{
		"Foo":                  "Foo",
		"(*Holder).Extend":     "Holder.Extend",
		"(Holder).Token":       "Holder.Token",
		"(*Set[K, V]).Add":     "Set.Add",
		"Event.Reason":         "Event.Reason",
		"Locker.Acquire, args": "Locker.Acquire, args",
	} {
		if got := plainName(in); got != want {
			t.Errorf("plainName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseReport(t *testing.T) {
	out := "- (*Holder).Extend: changed from func() error to func(context.Context) error\n- WithOld: removed\n"
	got := parseReport("example.com/m", out)
	want := []change{
		{"example.com/m", "(*Holder).Extend", "changed from func() error to func(context.Context) error"},
		{"example.com/m", "WithOld", "removed"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("parseReport = %v, want %v", got, want)
	}
}
