#!/usr/bin/env bash
# The real-node tier of `make test`: one real node up (e2e/scripts/realnode.sh), the
# production path run on it (e2e/scripts/production-path.sh: the chart, the operator as a
# pod, a worker pod committing with its projected token, a pod replaced, helm upgrade and
# uninstall), docs/install.md executed as written (e2e/scripts/install-doc.sh), the node
# down again whatever happened.
#
# One real node per machine: when another run holds the lock, this waits for it (up to
# HARNESS_REAL_NODE_WAIT seconds, default 1800) instead of failing at once.
# REAL_NODE=0 skips the tier with a message (for a machine where containerd, runc and
# root are not available: the tier cannot be faked by kwok).
#
# Env: HARNESS_ENGINE_BIN (the operator binary that goes into the image).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export HARNESS_E2E_RUN=${HARNESS_E2E_RUN:-$repo/target/e2e-node}
export HARNESS_ENGINE_BIN=${HARNESS_ENGINE_BIN:-$repo/target/debug/harness-engine}
LOCK=${HARNESS_E2E_NODE_LOCK:-/run/lock/harness-engine-real-node}
started=$SECONDS

if [[ ${REAL_NODE:-1} == 0 ]]; then
  echo "real-node tier: SKIPPED (REAL_NODE=0): the production path did not run" >&2
  exit 0
fi
"$here/realnode.sh" check || {
  echo "real-node tier: this machine cannot run a real node (see above); REAL_NODE=0 skips the tier" >&2
  exit 1
}

# Wait while a live real node of another run holds the lock (realnode.sh takes over a
# stale one by itself).
wait_s=${HARNESS_REAL_NODE_WAIT:-1800}
deadline=$((SECONDS + wait_s))
while [[ -d $LOCK ]]; do
  holder=$(cat "$LOCK/run" 2>/dev/null || true)
  [[ -z $holder || $holder == "$HARNESS_E2E_RUN" ]] && break
  pid=$(cat "$holder/pids/kube-apiserver.pid" 2>/dev/null || true)
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || break
  ((SECONDS < deadline)) || { echo "real-node tier: $holder still holds $LOCK after ${wait_s}s" >&2; exit 1; }
  echo "real-node tier: waiting for the real node of $holder ($LOCK)" >&2
  sleep 10
done

trap '"$here/realnode.sh" down >/dev/null 2>&1 || true' EXIT
"$here/realnode.sh" up
# shellcheck disable=SC1091
source "$HARNESS_E2E_RUN/env"
"$here/production-path.sh"
"$here/install-doc.sh"
echo "real-node tier: passed in $((SECONDS - started))s"
