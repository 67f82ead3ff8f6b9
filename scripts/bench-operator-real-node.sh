#!/usr/bin/env bash
# `make bench-operator REAL_NODE=1`: the operator benchmark on one real node (kubelet,
# containerd, runc; e2e/scripts/realnode.sh) instead of kwok. BINDINGS HarnessBindings
# (default 100) against as many bare SandboxClaims on an identical warm pool in the same
# run; the worker pods really run (our pause image, pinned by digest). Brings the real
# node up (waiting for the per-machine lock like the real-node tier) and down again.
# Also prints the operator image's size as containerd stores it.
#
# Env: HARNESS_ENGINE_BIN (the operator binary that goes into the image; the benchmark
# itself runs the release build as a host process, as on kwok).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
export HARNESS_E2E_RUN=${HARNESS_E2E_RUN:-$repo/target/e2e-node}
export HARNESS_ENGINE_BIN=${HARNESS_ENGINE_BIN:-$repo/target/debug/harness-engine}
trap '"$repo/e2e/scripts/realnode.sh" down >/dev/null 2>&1 || true' EXIT
"$repo/e2e/scripts/realnode.sh" up
# The benchmark reads the same env file as the kwok tier; the real node has no FerretDB
# (the benchmark runs the operator on its embedded store).
env_file=$HARNESS_E2E_RUN/bench.env
{ cat "$HARNESS_E2E_RUN/env"; echo "export HARNESS_E2E_MONGODB_URI=unused"; } >"$env_file"
# shellcheck disable=SC1091
source "$HARNESS_E2E_RUN/env"
ctr -a "$HARNESS_E2E_RUN/containerd/containerd.sock" -n k8s.io images ls |
  awk -v img="$HARNESS_E2E_OPERATOR_IMAGE" '$1 == img {print "operator image " $1 ": " $4 " " $5 " (containerd, compressed layers)"}'
HARNESS_E2E_ENV=$env_file HARNESS_BENCH_REAL_NODE=1 HARNESS_BENCH_BINDINGS=${BINDINGS:-100} \
  cargo bench --locked --bench operator
