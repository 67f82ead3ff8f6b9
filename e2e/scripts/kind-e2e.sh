#!/usr/bin/env bash
# `make kind-e2e`: the production path on a kind cluster, for users who have Docker.
# Only the cluster differs from the real-node tier that `make test` runs: kind creates
# it; then the same images (e2e/images/build.sh: the operator from ./Dockerfile, the
# example worker) are loaded onto its node, the Agent Sandbox controller runs beside it
# as on the real node, and the same steps run: e2e/scripts/production-path.sh and
# e2e/scripts/install-doc.sh, which reach the node through e2e/scripts/node-lib.sh
# (here: `docker exec` into the kind node).
#
# It cannot run on a machine without a Docker engine (CI's machines have none: CI runs
# the real-node tier). KEEP=1 keeps the cluster; KIND_CLUSTER names it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
log() { printf 'kind-e2e: %s\n' "$*" >&2; }

if ! command -v docker >/dev/null 2>&1 || ! docker info >/dev/null 2>&1; then
  log "needs a running Docker engine ('docker info' failed or docker is not installed)."
  log "Without Docker, run the real-node tier instead: make e2e-up REAL_NODE=1, or make test."
  exit 1
fi

cache_root=${HARNESS_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/harness-engine/e2e}
KIND_VERSION=v0.33.0
KIND=$(command -v kind || true)
if [[ -z $KIND ]]; then
  KIND=$cache_root/kind-$KIND_VERSION/kind
  if [[ ! -x $KIND ]]; then
    log "building kind $KIND_VERSION from Go modules"
    GOBIN=$(dirname "$KIND") GOTOOLCHAIN=local go install "sigs.k8s.io/kind@$KIND_VERSION"
  fi
fi

export HARNESS_E2E_RUN=$repo/target/e2e-kind
export HARNESS_ENGINE_BIN=${HARNESS_ENGINE_BIN:-$repo/target/debug/harness-engine}
[[ -x $HARNESS_ENGINE_BIN ]] || { log "no operator binary at $HARNESS_ENGINE_BIN (cargo build first)"; exit 1; }
CLUSTER=${KIND_CLUSTER:-harness-engine-e2e}
NODE=$CLUSTER-control-plane
mkdir -p "$HARNESS_E2E_RUN/logs" "$HARNESS_E2E_RUN/images"
BIN=$("$here/build.sh") # kubectl and the Agent Sandbox controller, as for the other tiers
export HARNESS_E2E_BIN=$BIN KUBECONFIG=$HARNESS_E2E_RUN/kubeconfig

sandbox_pid=
cleanup() {
  [[ -n $sandbox_pid ]] && kill "$sandbox_pid" 2>/dev/null || true
  if [[ ${KEEP:-0} != 1 ]]; then
    "$KIND" delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
  else
    log "kept cluster $CLUSTER (KUBECONFIG=$KUBECONFIG)"
  fi
}
trap cleanup EXIT

log "creating cluster $CLUSTER"
"$KIND" delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
"$KIND" create cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG" --wait 180s

log "building and loading images"
images=$HARNESS_E2E_RUN/images
TAG=dev "$repo/e2e/images/build.sh" operator "$images" "$HARNESS_ENGINE_BIN"
TAG=dev "$repo/e2e/images/build.sh" worker "$images"
for t in "$images"/operator.tar "$images"/worker.tar; do
  "$KIND" load image-archive "$t" --name "$CLUSTER"
done

# From here on, the steps are the real-node tier's, through node-lib.sh.
export HARNESS_E2E_NODE_EXEC="docker exec $NODE" HARNESS_E2E_CTR=ctr
export HARNESS_E2E_NODE_SELECTOR="{kubernetes.io/os: linux}"
export HARNESS_E2E_PV_ROOT=/var/local/harness-engine-e2e
# shellcheck source=node-lib.sh
source "$here/node-lib.sh"
tag_by_digest

"$BIN/kubectl" apply --server-side --force-conflicts -f "$BIN/agent-sandbox-crds/" >/dev/null
"$BIN/kubectl" wait --for=condition=Established --timeout=60s -f "$BIN/agent-sandbox-crds/" >/dev/null
ports=$(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
read -r metrics_port probe_port <<<"$ports"
"$BIN/agent-sandbox-controller" --kubeconfig="$KUBECONFIG" --extensions --leader-elect=false \
  --metrics-bind-address="127.0.0.1:$metrics_port" --health-probe-bind-address="127.0.0.1:$probe_port" \
  >"$HARNESS_E2E_RUN/logs/agent-sandbox-controller.log" 2>&1 &
sandbox_pid=$!
for _ in $(seq 1 60); do curl -fsS "http://127.0.0.1:$probe_port/readyz" >/dev/null 2>&1 && break; sleep 1; done

"$here/production-path.sh"
"$here/install-doc.sh"
log "passed"
