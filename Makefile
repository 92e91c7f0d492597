# The two commands a newcomer runs:
#   make demo   runs the main job: replicas racing for a cron tick, on memlock
#   make test   starts the services the tests need and runs every test with -race
.PHONY: demo test services fmt vet tidy

demo:
	cd examples && go run ./demo

test:
	scripts/test.sh

services:
	scripts/services.sh up

fmt:
	gofmt -w $$(git ls-files '*.go')

vet:
	for d in $$(go list -m -f '{{.Dir}}'); do (cd $$d && go vet ./...) || exit 1; done

tidy:
	for d in $$(go list -m -f '{{.Dir}}'); do (cd $$d && GOWORK=off go mod tidy) || exit 1; done
