#!/usr/bin/env bash
# Runs every test of every module with -race, after bringing up the services
# the integration tests use and checking gofmt, go vet, staticcheck
# (scripts/lint.sh) and the API against the last release
# (internal/apicheck). Under CI=true (or LOCK_REQUIRE_SERVICES=1) a service
# that cannot be reached fails the run instead of being skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${CI:-}" = true ]; then export LOCK_REQUIRE_SERVICES=1; fi
if ! scripts/services.sh up; then
	if [ "${LOCK_REQUIRE_SERVICES:-}" = 1 ]; then
		echo "services could not be started" >&2
		exit 1
	fi
	echo "warning: some services are down; their tests will skip" >&2
fi

unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
	printf 'not gofmt-formatted:\n%s\n' "$unformatted" >&2
	exit 1
fi

# One go command for every package of every module in go.work: it builds
# and runs packages in parallel, which a loop over modules would not.
go vet github.com/ubgo/lock/...
scripts/lint.sh
# Every published module's exported API against the last release tag: an
# incompatible change fails unless CHANGELOG.md's Unreleased section names
# it under "### Breaking" (CONTRIBUTING.md, API stability).
go run ./internal/apicheck
# -p 3 on two cores: the long packages (redislock, etcdlock, chaos, tests)
# spend most of their time waiting for leases to expire, failovers and
# restarts, not computing; a third binary at a time fills that wait.
go test -race -count=1 -p 3 -timeout 9m github.com/ubgo/lock/...
