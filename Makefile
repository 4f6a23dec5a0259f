# Ferry's developer commands. The two that matter on a fresh machine:
#   make demo   — Ferry's main job on embedded PostgreSQL and NATS
#   make test   — go vet and every test, with the race detector (both
#                 modules: Ferry's and consumer/)
GO ?= go

.PHONY: build bench-build demo test test-loaded vet lint bench bench-go bench-smoke fuzz chaos clean

# The shipped binary is linked with -s -w: no symbol table and no DWARF
# debug information, 39 MB instead of 56 MB. Panics and pprof profiles keep
# their function names, files and lines (those live in the pclntab, which
# stays); a debugger (dlv) needs an unstripped build: make build LDFLAGS=
LDFLAGS ?= -s -w
build:
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/ferry ./cmd/ferry

# The bench is a lab binary of its own (cmd/ferry-bench), so the ferry
# binary links none of it. It runs each system under test as a child of
# itself, so it needs no ferry binary beside it.
bench-build:
	$(GO) build -o bin/ferry-bench ./cmd/ferry-bench

demo:
	$(GO) run ./cmd/ferry demo

# consumer/ is a Go module of its own (consuming services import it without
# Ferry's dependencies), which ./... at the root does not reach: vet, test
# and lint run in it too.
CONSUMER = consumer

vet:
	$(GO) vet ./...
	cd $(CONSUMER) && $(GO) vet ./...

# staticcheck over every package of both modules, at a pinned version
# installed into bin/ the first time (CI runs it before make test).
STATICCHECK_VERSION = v0.8.2
STATICCHECK = bin/staticcheck-$(STATICCHECK_VERSION)
$(STATICCHECK):
	GOBIN=$(CURDIR)/bin $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv bin/staticcheck $@
lint: $(STATICCHECK)
	$(STATICCHECK) ./...
	cd $(CONSUMER) && $(CURDIR)/$(STATICCHECK) ./...

test: vet
	$(GO) test -race -count=1 -timeout 30m ./...
	cd $(CONSUMER) && $(GO) test -race -count=1 -timeout 10m ./...

# make test beside LOAD busy CPU loops (default 2, one per core of a
# 2-core CI machine): what a machine shared with other builds does to the
# suite's timing. LOADED replaces the command run under load, e.g.
#   make test-loaded LOADED='go test -race -count=6 -run TestX ./service/'
# The loops are killed when the command ends, fails or is interrupted, and
# each also stops once the recipe's shell is gone (a kill that lands before
# a loop's shell is set up is lost, and kill -9 runs no trap).
LOAD ?= 2
LOADED ?= $(MAKE) test
test-loaded:
	@pids=; trap 'kill $$pids 2>/dev/null' EXIT INT TERM; \
	for i in $$(seq $(LOAD)); do sh -c "while kill -0 $$$$ 2>/dev/null; do :; done" & pids="$$pids $$!"; done; \
	echo "$(LOAD) busy loops:$$pids"; \
	$(LOADED)

# The standard matrix of `ferry-bench` (every scenario, source and sink,
# against watermill-sql and the broker ceiling measured in the same run);
# about 75 minutes on 2 cores. BENCHFLAGS adds flags, e.g. BENCHFLAGS=--quick.
bench: bench-build
	bin/ferry-bench --markdown bin/bench.md $(BENCHFLAGS)

# Go micro-benchmarks of the hot paths and the service-backed drains.
bench-go:
	$(GO) test -run '^$$' -bench . -benchmem ./...

# The hot-path benchmarks, once each, so they keep compiling and running (CI).
HOTPATH = ./sources/window/ ./sources/outbox/ ./engine/ ./transforms/...
bench-smoke:
	$(GO) test -run '^$$' -bench . -benchtime 1x $(HOTPATH)

# Each fuzz target for FUZZTIME, a duration or a count of inputs (CI runs
# 30000x each; run longer by hand: make fuzz FUZZTIME=10m). Seed corpora
# live in each package's testdata/fuzz.
FUZZTIME ?= 10s
FUZZ_TARGETS = FuzzLoad:./pipelines FuzzMessage:./sources/outbox FuzzRoute:./transforms/router FuzzFilter:./transforms/filter FuzzParse:./internal/migrate FuzzDecode:./internal/httpapi
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		name=$${t%%:*}; pkg=$${t#*:}; \
		echo "fuzz $$name ($$pkg) for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	done

# The fault-injection suite's full plan: every source × sink, every fault
# (20 kills, 5 broker restarts, 3 PostgreSQL crashes, network cuts, 1,000
# commit interleavings); writes docs/reliability.md. About 40 minutes. `make
# test` runs its bounded plan.
chaos:
	FERRY_CHAOS=full FERRY_CHAOS_REPORT=$(CURDIR)/docs/reliability.md $(GO) test -count=1 -timeout 3h -run '^TestChaos$$' -v ./chaos/

clean:
	rm -rf bin
