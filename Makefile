# The two commands a newcomer runs:
#   make demo   four claims shown with real processes on flock/filelock, checked
#   make test   starts the services the tests need and runs every test with -race
.PHONY: demo test services bench chaos fmt vet lint tidy

demo:
	cd examples && go run ./demo

test:
	scripts/test.sh

services:
	scripts/services.sh up

# Every backend beside its floor and its peers, in one interleaved run
# (a few minutes); results and method in docs/benchmarks.md.
bench:
	-scripts/services.sh up
	cd bench && go run ./cmd/bench $(BENCHFLAGS)

# Every backend under random faults for a few minutes, then 20 rounds of
# a waiter paused across its grant (~18 min in all); prints a table per
# backend. Method and results: docs/design/chaos.md.
# Then the cluster failover tests, repeated (~8 min), and the fault
# matrix: every network backend, fault, moment, kind and mode, twice
# (~13 min, on private servers of its own; a table of every cell).
chaos:
	scripts/services.sh up
	cd chaos && CHAOS_LONG=1 go test -count=1 -timeout 30m -run '^(TestChaos|TestPausedWaiter)$$' -v .
	# Failovers on private clusters, five times each (make test runs them once).
	cd redislock && go test -count=5 -timeout 20m -run '^Test(ClusterFailover|ClusterReplicaAck|SentinelFailover)$$' .
	cd etcdlock && go test -count=5 -timeout 20m -run '^TestCluster(LeaderKilled|QuorumLost)$$' .
	cd chaos && CHAOS_LONG=1 go test -count=1 -timeout 60m -run '^TestFaultMatrix$$' -v .

fmt:
	gofmt -w $$(git ls-files '*.go')

vet:
	for d in $$(go list -m -f '{{.Dir}}'); do (cd $$d && go vet ./...) || exit 1; done

# staticcheck (the pinned version, installed if missing) in every module,
# for this system, windows and darwin; make test runs it too.
lint:
	scripts/lint.sh

tidy:
	for d in $$(go list -m -f '{{.Dir}}'); do (cd $$d && GOWORK=off go mod tidy) || exit 1; done
