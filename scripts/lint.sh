#!/usr/bin/env bash
# Runs staticcheck in every module of go.work, for this system and for
# windows and darwin (files behind build constraints are only checked for
# their system). Installs the pinned staticcheck with go install if it is
# missing or another version.
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.8.2
gobin=$(go env GOBIN)
gopath=$(go env GOPATH)
staticcheck=${gobin:-${gopath%%:*}/bin}/staticcheck
if ! "$staticcheck" -version 2>/dev/null | grep -qF "($version)"; then
	go install "honnef.co/go/tools/cmd/staticcheck@v$version"
fi

# The modules not built for a system, for the reasons given in
# tests/crossbuild_test.go.
skip=" filelock/windows examples/windows bench/windows bench/darwin "

status=0
for goos in "" windows darwin; do
	for dir in $(go list -m -f '{{.Dir}}'); do
		mod=${dir#"$PWD"}
		mod=${mod#/}
		if [ -n "$goos" ] && [[ $skip == *" $mod/$goos "* ]]; then
			continue
		fi
		if ! (cd "$dir" && env ${goos:+GOOS=$goos CGO_ENABLED=0} "$staticcheck" ./...); then
			echo "staticcheck failed in ${mod:-.}${goos:+ for $goos}" >&2
			status=1
		fi
	done
done
exit $status
