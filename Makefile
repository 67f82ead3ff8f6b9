# Harness Engine: developer entry points. `make test` is what CI runs.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
CARGO ?= cargo
# A hung test fails `make test` after this long (seconds) instead of eating CI's limit.
TEST_TIMEOUT ?= 2400
E2E := e2e/scripts

.PHONY: kind-e2e all build test lint fmt crds openapi mcp-tools bench-mcp unit e2e-build e2e-up e2e-down dev clean-e2e bench-store bench-api bench-operator bench-memory bench-memory-scan bench-ledger bench-abuse python-test bench-python ci-fresh install-yaml chaos fuzz

all: build

build:
	$(CARGO) build --locked

## test: everything CI checks: formatting, lints, generated files, unit and integration
## tests against a real local control plane (started and stopped here), the Python
## suites, and the production path on one real node (REAL_NODE=0 skips that tier).
test: lint e2e-build
	$(CARGO) build --locked --all-targets
	$(E2E)/with-control-plane.sh timeout --kill-after=30 $(TEST_TIMEOUT) $(CARGO) test --locked --all-targets
	HARNESS_ENGINE_BIN=$${CARGO_TARGET_DIR:-target}/debug/harness-engine scripts/schemathesis.sh
	HARNESS_ENGINE_BIN=$${CARGO_TARGET_DIR:-target}/debug/harness-engine scripts/mcp-conformance.sh
	HARNESS_ENGINE_BIN=$${CARGO_TARGET_DIR:-target}/debug/harness-engine scripts/python-tests.sh
	FUZZ_SECONDS=60 FUZZ_JOBS=2 scripts/fuzz.sh
	HARNESS_ENGINE_BIN=$$(realpath $${CARGO_TARGET_DIR:-target})/debug/harness-engine $(E2E)/real-node-tier.sh

## python-test: every Python suite (both SDK conformance suites, the Strands loop, the
## two-writer test, the Deep Agents example) against a live `serve`, in a pinned venv.
python-test:
	$(CARGO) build --locked --bin harness-engine
	HARNESS_ENGINE_BIN=$${CARGO_TARGET_DIR:-target}/debug/harness-engine scripts/python-tests.sh

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --locked --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## crds: regenerate crds/ from src/api (a test fails when they drift).
crds:
	$(CARGO) run --locked --quiet -- crds --out-dir crds
	$(CARGO) run --locked --quiet -- crds --out-dir config/crd/bases
	$(CARGO) run --locked --quiet -- crds --out-dir charts/harness-engine/crds

## openapi: regenerate docs/openapi.json from the code (a test fails when it drifts).
openapi:
	$(CARGO) run --locked --quiet -- openapi --out docs/openapi.json

## mcp-tools: the MCP tool list and schema digest (docs/mcp-tools.json; a test compares).
mcp-tools:
	$(CARGO) run --locked --quiet -- mcp-tools --out docs/mcp-tools.json

## unit: tests that need no control plane.
unit:
	$(CARGO) test --locked --lib

## bench-store: commit rounds per second and latency for both store backends, next to a
## same-run SQLite baseline (the same durable writes through the same group commit, no
## protocol) (prints a table, writes target/bench/store.json).
bench-store: e2e-build
	$(CARGO) bench --locked --bench store

## bench-memory: memory search p50/p99 by words and by embedding (100,000 in the
## namespace, 1,000,000 in total), recall@10 of embedding search against exact cosine,
## and put throughput on the embedded store beside a same-run baseline of the same bytes;
## HARNESS_BENCH_MEMORY_MONGO=1 adds the same search and puts on FerretDB (slow to load)
## (prints a table, writes target/bench/memory.json).
bench-memory:
	$(CARGO) bench --locked --bench memory

## bench-memory-scan: the cost of scanning one memory write (secret catalog, normalized
## injection and topic screening), p50/p99 per body size (writes target/bench/memory_scan.json).
bench-memory-scan:
	$(CARGO) bench --locked --bench memory_scan

## bench-abuse: serve's peak resident memory while 64 clients send the worst bodies the
## API accepts or refuses (writes target/bench/abuse.json).
bench-abuse:
	$(CARGO) bench --locked --bench abuse

## bench-ledger: run-ledger event appends per second at 64 bindings and a 10,000-event
## run read on SQLite, p50/p99 (prints a table, writes target/bench/ledger.json).
bench-ledger:
	$(CARGO) bench --locked --bench ledger

## bench-mcp: MCP tools/call round trips (recall, record_run_event) at 1 and 32
## sessions over /mcp (prints a table, writes target/bench/mcp.json).
bench-mcp:
	$(CARGO) bench --locked --bench mcp

## bench-api: turns per second over HTTP (state/commit-inline, and pending + commit) and
## idle RSS of `serve` (prints a table, writes target/bench/api.json).
bench-api:
	$(CARGO) bench --locked --bench api

## bench-operator: BINDINGS (default 500) bindings created at once on the local control
## plane, and as many bare SandboxClaims on an identical warm pool in the same run: time
## to all Ready and its ratio to the bare claims, our overhead p50/p99, API requests per
## binding, operator RSS, recovery over 20 operator restarts (prints a table, writes
## target/bench/operator.json). REAL_NODE=1: on one real node instead of kwok (default
## 100 bindings; scripts/bench-operator-real-node.sh).
bench-operator: e2e-build
ifeq ($(REAL_NODE),1)
	$(CARGO) build --locked --bin harness-engine
	BINDINGS=$(or $(BINDINGS),100) scripts/bench-operator-real-node.sh
else
	$(if $(BINDINGS),HARNESS_BENCH_BINDINGS=$(BINDINGS)) $(E2E)/with-control-plane.sh $(CARGO) bench --locked --bench operator
endif

## bench-python: LangGraph checkpointers side by side (ours, SQLite, PostgreSQL), eight
## rounds alternating the three: checkpoints/s and put p99, medians and ratios (prints a
## table, writes target/bench/python.json).
bench-python:
	scripts/bench-python.sh

## chaos: one checked-history run under faults (docs/reliability.md): concurrent clients
## against `serve` (BACKEND=sqlite) or the data plane on its own FerretDB (BACKEND=mongo)
## while servers are killed and paused and the data disk fills; porcupine checks the
## history. The same SEED gives the same schedule of operations and faults.
## make chaos SEED=42 BACKEND=mongo DURATION=15m (defaults: seed from the clock, sqlite, 60s)
SEED ?=
BACKEND ?= sqlite
DURATION ?= 60s
chaos:
	CHAOS_SEED=$(SEED) CHAOS_BACKEND=$(BACKEND) CHAOS_DURATION=$(DURATION) \
	  $(CARGO) test --locked --test chaos -- --ignored --exact chaos --nocapture

## fuzz: build the fuzz targets of fuzz/ (nightly, libFuzzer) and run each for SECONDS
## (default 60) on its committed corpus; TARGETS=... picks some, JOBS=2 runs two at once
## (docs/reliability.md "Fuzzing").
SECONDS ?= 60
JOBS ?= 1
TARGETS ?=
fuzz:
	FUZZ_SECONDS=$(SECONDS) FUZZ_JOBS=$(JOBS) scripts/fuzz.sh $(TARGETS)

## ci-fresh: clone HEAD into a temporary directory and run .ci/run there with empty Go,
## e2e and Cargo caches: the cold start a new machine sees (KEEP=1 keeps the directory).
ci-fresh:
	scripts/ci-fresh.sh

e2e-build:
	$(E2E)/build.sh >/dev/null
	$(E2E)/build-tools.sh >/dev/null

## install-yaml: the flat manifest of a release for `kubectl apply -f` (CRDs + the
## chart's defaults, identity key brought by the user) into dist/install.yaml.
install-yaml:
	scripts/install-yaml.sh dist/install.yaml $(HELM_ARGS)

## e2e-up: the local control plane with kwok (fast, many pods); REAL_NODE=1: one real
## node instead (containerd, runc, kubelet, kube-proxy; our images imported; one per
## machine, locked): e2e/scripts/realnode.sh, run dir target/e2e-node.
e2e-up: e2e-build
ifeq ($(REAL_NODE),1)
	$(CARGO) build --locked --bin harness-engine
	$(E2E)/realnode.sh up
else
	$(E2E)/up.sh
endif

## kind-e2e: for users with Docker: a kind cluster, our images loaded onto its node, and
## the same production-path and install-doc steps as the real-node tier (CI runs that
## tier; this machine has no Docker engine). KEEP=1 keeps the cluster.
kind-e2e: e2e-build
	$(CARGO) build --locked --bin harness-engine
	HARNESS_ENGINE_BIN=$$(realpath $${CARGO_TARGET_DIR:-target})/debug/harness-engine $(E2E)/kind-e2e.sh

e2e-down:
ifeq ($(REAL_NODE),1)
	$(E2E)/realnode.sh down
else
	$(E2E)/down.sh
endif

## dev: the operator on the embedded store against the local control plane (target/e2e):
## CRDs installed, samples applied in namespace `dev`, operator in the foreground (Ctrl-C
## stops it; `make e2e-down` stops the control plane).
dev: e2e-up
	$(CARGO) build --locked
	@source target/e2e/env && $$HARNESS_E2E_BIN/kubectl apply --server-side -f crds/ >/dev/null && \
	  $$HARNESS_E2E_BIN/kubectl wait --for=condition=Established --timeout=60s -f crds/ >/dev/null && \
	  ($$HARNESS_E2E_BIN/kubectl get namespace dev >/dev/null 2>&1 || $$HARNESS_E2E_BIN/kubectl create namespace dev) && \
	  $$HARNESS_E2E_BIN/kubectl apply -k config/samples -n dev && \
	  echo "control plane up: export KUBECONFIG=$(CURDIR)/target/e2e/kubeconfig; try: kubectl get harnessbindings -n dev" && \
	  $${CARGO_TARGET_DIR:-target}/debug/harness-engine operator --namespace dev --no-leader-election \
	    --listen 127.0.0.1:8080 --admin-listen 127.0.0.1:8081 --data-dir target/dev-data --environment dev

clean-e2e:
	$(E2E)/down.sh --purge
