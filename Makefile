# Ferry's developer commands. The two that matter on a fresh machine:
#   make demo   — Ferry's main job on embedded PostgreSQL and NATS
#   make test   — go vet and every test, with the race detector
GO ?= go

.PHONY: build demo test vet bench clean

build:
	$(GO) build -o bin/ferry ./cmd/ferry

demo:
	$(GO) run ./cmd/ferry demo

vet:
	$(GO) vet ./...

test: vet
	$(GO) test -race -count=1 -timeout 30m ./...

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

clean:
	rm -rf bin
