# kasa — run `make help` for the targets.
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
TEMPORAL_CLI_VERSION := v1.5.1
TEMPORAL := $(BIN)/temporal
# -race needs cgo; every package's tests run with it where the toolchain allows.
RACE := $(shell $(GO) env CGO_ENABLED | grep -q 1 && echo -race)

.DEFAULT_GOAL := help
.PHONY: help build run run-cluster nats-server temporal-ui test bench lint temporal-cli temporal-server fuzz fuzz-targets clean generate check-generated size

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*?## "}{printf "  %-16s %s\n", $$1, $$2}'

build: ## build ./bin/kasa
	$(GO) build -buildvcs=auto -o $(BIN)/kasa ./cmd/kasa

$(TEMPORAL):
	@echo "building the Temporal CLI $(TEMPORAL_CLI_VERSION) into ./bin (first time only, ~3 min)"
	GOBIN=$(BIN) $(GO) install github.com/temporalio/cli/cmd/temporal@$(TEMPORAL_CLI_VERSION)

temporal-cli: $(TEMPORAL) ## build the pinned Temporal CLI (dev server + Web UI) into ./bin when missing

# The real, multi-service Temporal Server and its schema tool, as binaries: the server's module does
# not build inside kasa's (its API version differs from the SDK's), so it is never imported.
# go install names them server and sql: they are built in a scratch GOBIN and renamed.
TEMPORAL_SERVER_VERSION := v1.29.1
TEMPORAL_SERVER := $(BIN)/temporal-server
TEMPORAL_SQL_TOOL := $(BIN)/temporal-sql-tool

$(TEMPORAL_SERVER):
	@echo "building the Temporal Server $(TEMPORAL_SERVER_VERSION) into ./bin (first time only, ~4 min)"
	@mkdir -p $(BIN); tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	  GOBIN=$$tmp $(GO) install go.temporal.io/server/cmd/server@$(TEMPORAL_SERVER_VERSION) && mv "$$tmp/server" $@

$(TEMPORAL_SQL_TOOL):
	@echo "building the Temporal SQL schema tool $(TEMPORAL_SERVER_VERSION) into ./bin (first time only)"
	@mkdir -p $(BIN); tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	  GOBIN=$$tmp $(GO) install go.temporal.io/server/cmd/tools/sql@$(TEMPORAL_SERVER_VERSION) && mv "$$tmp/sql" $@

# tools/devenv reads the schemas from the module cache: the download is a no-op when they are there.
temporal-server: $(TEMPORAL_SERVER) $(TEMPORAL_SQL_TOOL) ## build the pinned Temporal Server and its SQL schema tool into ./bin when missing
	@$(GO) mod download go.temporal.io/server@$(TEMPORAL_SERVER_VERSION)

# An external NATS server for make run-cluster, at the version go.mod pins for the embedded one.
NATS_SERVER := $(BIN)/nats-server
$(NATS_SERVER):
	@mkdir -p $(BIN)
	GOBIN=$(BIN) $(GO) install github.com/nats-io/nats-server/v2@$$($(GO) list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2)

nats-server: $(NATS_SERVER) ## build the pinned NATS server into ./bin when missing

# The Temporal Web UI server the CLI embeds, as a binary of its own to point at the real server.
TEMPORAL_UI_VERSION := v2.42.1
TEMPORAL_UI := $(BIN)/temporal-ui
$(TEMPORAL_UI):
	@echo "building the Temporal Web UI server $(TEMPORAL_UI_VERSION) into ./bin (first time only, ~1 min)"
	@mkdir -p $(BIN); tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	  GOBIN=$$tmp $(GO) install github.com/temporalio/ui-server/v2/cmd/server@$(TEMPORAL_UI_VERSION) && mv "$$tmp/server" $@

temporal-ui: $(TEMPORAL_UI) ## build the pinned Temporal Web UI server into ./bin when missing

run-cluster: build temporal-server nats-server temporal-ui ## run the system as separate processes: real Temporal Server, NATS, 2 APIs, 2 workers, relay
	$(BIN)/kasa cluster

run: build temporal-cli ## run the whole system locally (PostgreSQL, Temporal + UI, bank simulator, worker, relay, API)
	$(BIN)/kasa dev

test: temporal-cli temporal-server nats-server temporal-ui ## run every test: unit, integration (real PostgreSQL + Temporal) and end-to-end
	$(GO) vet ./...
	$(GO) test $(RACE) -count=1 -timeout 30m ./...

# What test-fast leaves to test: the end-to-end tests (Temporal, kasa processes), the outbox
# (PostgreSQL + NATS, timed deliveries), the benchmark (pgbench runs) and the chaos soak; and,
# by -short, make fuzz's own run.
SLOW_PKGS := /(tests|outbox|bench|soak)(/|$$)
.PHONY: test-fast
test-fast: temporal-cli temporal-server ## unit, store and api tests: everything but the end-to-end, outbox, bench and soak packages
	$(GO) test $(RACE) -short -count=1 $$($(GO) list ./... | grep -Ev '$(SLOW_PKGS)')

# The standard suite: about 5 minutes here, plus the preload (docs/performance.md).
BENCH_PRELOAD ?= 1000000
bench: build temporal-cli ## measure: ceilings, targets and correctness; writes bench/results/<date>.{md,json}
	$(BIN)/kasa bench --suite --preload $(BENCH_PRELOAD) --out bench/results

.PHONY: bench-payday
bench-payday: build temporal-server ## a payday burst at 10 x T on the real Temporal Server, drained; writes bench/results/<date>-payday.{md,json}
	$(BIN)/kasa bench --payday --temporal=server --duration 60s --out bench/results

# The chaos soak (docs/tools.md): 10 minutes by default; pass kasa soak's flags in SOAK_FLAGS,
# e.g. make soak SOAK_FLAGS="--duration 3m --seed 42".
SOAK_FLAGS ?=
.PHONY: soak
soak: build temporal-cli temporal-server nats-server ## chaos soak: processes, servers, bank and network fail under load; writes bench/results/soak-<date>-<shape>.{md,json}
	$(BIN)/kasa soak --out bench/results $(SOAK_FLAGS)

# staticcheck and workflowcheck are tools of go.mod: `go tool` builds the pinned versions.
lint: ## gofmt, go vet, staticcheck, and Temporal's workflowcheck over the workflows
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool staticcheck ./...
	$(GO) tool workflowcheck ./workflows/...
	@$(MAKE) --no-print-directory check-generated

generate: ## regenerate store/internal/dbsqlc (sqlc), tools/bench/pgbench/*.sql and payment/currencies_gen.go (ISO 4217)
	$(GO) tool sqlc generate -f store/sqlc.yaml
	$(GO) run tools/bench/pgbench/gen.go
	$(GO) run payment/iso4217/gen.go

check-generated: generate ## fail when the generated code is not what make generate writes
	@git diff --exit-code -- store/internal/dbsqlc tools/bench/pgbench payment/currencies_gen.go || { echo "generated code is out of date: run make generate and commit"; exit 1; }
	@out=$$(git status --porcelain --untracked-files=all -- store/internal/dbsqlc tools/bench/pgbench payment/currencies_gen.go); if [ -n "$$out" ]; then echo "untracked generated files:"; echo "$$out"; exit 1; fi

# Every `func Fuzz...` in a _test.go file is a target, found anew on each run; they run one after
# another for FUZZTIME each, and a failing target does not stop the others (the list of failures
# comes at the end). E.g. make fuzz FUZZTIME=3m FUZZFLAGS='-parallel 1'; a count (FUZZTIME=1000000x)
# avoids Go 1.26's race at the end of a timed run on a busy machine (bench/results/fuzz-2026-12-05.md).
FUZZTIME ?= 20s
FUZZFLAGS ?=
fuzz-targets: ## list every fuzz target: <package dir> <name>
	@for f in $$(grep -rl --include='*_test.go' --exclude-dir=.git --exclude-dir=.data --exclude-dir=bin --exclude-dir=testdata '^func Fuzz' . | sort); do \
	  for t in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do echo "$$(dirname $$f) $$t"; done; \
	done

fuzz: ## run every fuzz target for FUZZTIME (20s) each; FUZZFLAGS go to go test
	@failed=""; \
	while read -r pkg t; do \
	  echo "== $$pkg $$t ($(FUZZTIME))"; \
	  $(GO) test $$pkg -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) $(FUZZFLAGS) </dev/null || failed="$$failed $$pkg:$$t"; \
	done < <($(MAKE) --no-print-directory -s fuzz-targets); \
	if [ -n "$$failed" ]; then echo "fuzz targets that failed:$$failed"; exit 1; fi

size: ## lines of Go, tests and generated code apart: the developer tools (tools/, and cmd/kasa's tool commands) against the service
	@lines() { cat "$$@" /dev/null | wc -l; }; \
	gofiles=$$(git ls-files '*.go' | grep -v -e '_test\.go$$' -e '/dbsqlc/' -e '_gen\.go$$'); \
	cmdtools=$$(grep -l '^//go:build !production' $$(echo "$$gofiles" | grep '^cmd/')); \
	tools=$$(lines $$(echo "$$gofiles" | grep '^tools/') $$cmdtools); \
	bench=$$(lines $$(echo "$$gofiles" | grep '^tools/bench/')); \
	service=$$(lines $$(echo "$$gofiles" | grep -v '^tools/' | grep -v -x -F "$$cmdtools")); \
	echo "service $$service, tools $$tools (tools/bench $$bench): tools / service = $$(awk "BEGIN{printf \"%.2f\", $$tools/$$service}")"

clean: ## remove build outputs (keeps .data)
	rm -rf $(BIN)
