#!/usr/bin/env bash
# Releases every module of the repository under one version.
#
#   scripts/release.sh VERSION          print the plan: the go.mod edits and the tags
#   scripts/release.sh --apply VERSION  make one release commit and the tags, locally
#
# The release commit sets every require of a module of this repository, in
# every go.mod (published or not), to VERSION, and drops the relative
# replace directives from the published modules' go.mod files: `go install
# github.com/ubgo/lock/cmd/lock@VERSION` refuses a module whose go.mod has
# any (go.work still ties the modules together in that tree). Each
# published module gets its tag on that commit: VERSION for the root,
# DIR/VERSION for the module in DIR, as the go command expects of a
# multi-module repository. A second commit puts the replace directives
# back, for builds without go.work (GOWORK=off, make tidy). Nothing is
# pushed.
set -euo pipefail

# Modules that are developed here but not published: nobody imports them,
# so they get no tag. Any other directory with a go.mod is published.
unpublished="bench chaos examples tests"

die() {
	echo "release: $*" >&2
	exit 1
}

apply=false
if [ "${1:-}" = --apply ]; then
	apply=true
	shift
fi
[ $# -eq 1 ] || die "usage: scripts/release.sh [--apply] VERSION (e.g. v0.1.0)"
version=$1

# vMAJOR.MINOR.PATCH with an optional -prerelease, as semver and the go
# command accept it (no leading zeros, no +build metadata).
num='(0|[1-9][0-9]*)'
ident='[0-9A-Za-z-]+'
if ! [[ $version =~ ^v$num\.$num\.$num(-$ident(\.$ident)*)?$ ]]; then
	die "malformed version \"$version\": want vMAJOR.MINOR.PATCH with an optional -prerelease, e.g. v0.1.0 or v1.2.0-rc.1"
fi

cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"

if [ -n "$(git status --porcelain)" ]; then
	git status --short >&2
	die "the work tree is not clean: commit or stash the changes above first"
fi

modpath() { go mod edit -print "$1" | awk '$1 == "module" { print $2; exit }'; }

# Every module of the repository: the directory of each tracked go.mod
# outside testdata, the root (".") first.
dirs=()
while IFS= read -r d; do
	case "/$d/" in */testdata/*) continue ;; esac
	dirs+=("$d")
done < <(git ls-files -- go.mod '*/go.mod' | sed 's|/*go\.mod$||; s|^$|.|' | LC_ALL=C sort)
[ -f go.mod ] || die "no go.mod at the root of the repository"
root=$(modpath go.mod)

# The module in DIR must be ROOT/DIR: the go command finds a module's
# versions under the tag prefix of that subdirectory.
paths=()
tags=()
for d in "${dirs[@]}"; do
	p=$(modpath "$d/go.mod")
	if [ "$d" = . ]; then
		want=$root
	else
		want=$root/$d
	fi
	[ "$p" = "$want" ] || die "$d/go.mod declares module $p; its tags would need it to be $want"
	paths+=("$p")
	case " $unpublished " in *" $d "*) continue ;; esac
	if [ "$d" = . ]; then
		tags+=("$version")
	else
		tags+=("$d/$version")
	fi
done

for t in "${tags[@]}"; do
	if git rev-parse -q --verify "refs/tags/$t" >/dev/null; then
		die "tag $t already exists: $version has been released (pick another version)"
	fi
done

isrepo() {
	local p
	for p in "${paths[@]}"; do [ "$p" = "$1" ] && return 0; done
	return 1
}

# requires prints the modules go.mod $1 requires, as "path version" lines.
requires() {
	go mod edit -print "$1" | awk '
		/^require \($/ { block = 1; next }
		block && /^\)/ { block = 0; next }
		block && NF >= 2 { print $1, $2 }
		/^require [^(]/ { print $2, $3 }'
}

# replaces prints the replace directives of go.mod $1, one a line, as
# "OLD [VERSION] => NEW [VERSION]".
replaces() {
	go mod edit -print "$1" | awk '
		/^replace \($/ { block = 1; next }
		block && /^\)/ { block = 0; next }
		block && NF >= 3 { sub(/^[ \t]+/, ""); print; next }
		/^replace [^(]/ { sub(/^replace /, ""); print }'
}

published() {
	case " $unpublished " in *" $1 "*) return 1 ;; esac
	return 0
}

# The edits, checked before anything is changed: requires (every go.mod)
# and replace directives to drop (published go.mod files only).
requireEdits=() # "FILE PATH@VERSION"
dropEdits=()    # "FILE PATH"
plan=()
for d in "${dirs[@]}"; do
	f=$d/go.mod
	[ "$d" = . ] && f=go.mod
	while read -r p v; do
		case "$p" in "$root" | "$root"/*) ;; *) continue ;; esac
		isrepo "$p" || die "$f requires $p, which is no module of this repository"
		[ "$v" = "$version" ] && continue
		requireEdits+=("$f $p@$version")
		plan+=("  $f: require $p $v -> $version")
	done < <(requires "$f")
	published "$d" || continue
	while read -r line; do
		old=${line%% *}
		new=${line#*=> }
		new=${new%% *}
		case "$new" in . | .. | ./* | ../*) ;; *) new= ;; esac
		if [ -z "$new" ] || ! isrepo "$old"; then
			die "$f has \"replace $line\": go install of a published module refuses any replace, and the release drops only relative replaces of this repository's modules"
		fi
		dropEdits+=("$f $old")
		plan+=("  $f: drop replace $line")
	done < <(replaces "$f")
done

if $apply; then
	echo "releasing $version"
else
	echo "plan for $version (nothing is changed; run with --apply to make it)"
fi
echo
echo "go.mod edits on the release commit:"
if [ ${#plan[@]} -gt 0 ]; then
	printf '%s\n' "${plan[@]}"
else
	echo "  (none: every require is already $version, no published go.mod has a replace)"
fi
if [ ${#dropEdits[@]} -gt 0 ]; then
	echo "then a commit that puts the dropped replace directives back, for builds without go.work"
fi

echo
echo "tags, on the release commit:"
for t in "${tags[@]}"; do
	echo "  $t"
done
echo "unpublished, not tagged: $unpublished"

if ! $apply; then
	exit 0
fi

edited=()
for e in "${requireEdits[@]}"; do
	go mod edit -require="${e#* }" "${e%% *}"
	edited+=("${e%% *}")
done
# The published go.mod files as development needs them: requires at
# $version, replace directives kept. They come back after the tags.
keep=$(mktemp -d)
trap 'rm -rf "$keep"' EXIT
dropped=()
for e in "${dropEdits[@]}"; do
	f=${e%% *}
	if [ ! -e "$keep/$f" ]; then
		mkdir -p "$keep/$(dirname "$f")"
		cp "$f" "$keep/$f"
		dropped+=("$f")
	fi
	go mod edit -dropreplace="${e#* }" "$f"
	edited+=("$f")
done

release=$(git rev-parse --short HEAD)
if [ ${#edited[@]} -gt 0 ]; then
	git add -- "${edited[@]}"
	git commit -q -m "Release $version" -m "Every module of the repository requires the others at $version; the published modules' go.mod files have no replace directives, so that go install of a command at $version works (go.work ties the modules together in this tree)."
	release=$(git rev-parse --short HEAD)
fi
for t in "${tags[@]}"; do
	git tag -a -m "Release $t" "$t"
done
if [ ${#dropped[@]} -gt 0 ]; then
	for f in "${dropped[@]}"; do
		cp "$keep/$f" "$f"
	done
	git add -- "${dropped[@]}"
	git commit -q -m "Back to development after $version: the relative replace directives again" -m "For builds without go.work (GOWORK=off, make tidy); the release commit $release, which the tags name, has none."
fi
echo
echo "made the release commit $release and ${#tags[@]} tags on it; HEAD is $(git rev-parse --short HEAD); nothing was pushed."
echo "to publish: git push origin HEAD ${tags[*]}"
