#!/usr/bin/env bash
# docs/install.md, executed as written on the real node (e2e/scripts/realnode.sh up
# first; `source $RUN/env`) or on a kind cluster (e2e/scripts/kind-e2e.sh). Every ```sh block of the page carries a marker comment on
# the line before it: `<!-- install-doc: helm -->`, `<!-- install-doc: yaml -->` or
# `<!-- install-doc: skip (why) -->`. The blocks of each path run in page order,
# literally, in one `bash -eu` session (no pipefail: as typed in a shell) from the repository root; before each
# path this script provides only what a user's cluster would: images on the node
# (IMAGE_REPOSITORY, IMAGE_TAG, NEW_TAG), helm and kubectl on PATH, and a
# PersistentVolume for the store's claim (this node has no provisioner). A block with no
# marker, or a path with no block, fails the test.
set -euo pipefail
: "${KUBECONFIG:?source the real node env first (e2e/scripts/realnode.sh up)}"
repo=$(cd "$(dirname "$0")/../.." && pwd)
doc=$repo/docs/install.md
K() { "$HARNESS_E2E_BIN/kubectl" "$@"; }
# ctr_ and node_sh: the real node, or a kind node under `make kind-e2e`.
# shellcheck source=node-lib.sh
source "$repo/e2e/scripts/node-lib.sh"
tools=$("$repo/e2e/scripts/build-tools.sh")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
NS=harness-engine-system
T0=$SECONDS
fail() { echo "FAIL: $*" >&2; K -n $NS get pods -o wide >&2 2>/dev/null || true; exit 1; }

# The blocks, split by marker: $work/<path>/NN.sh.
awk -v out="$work" '
  /^<!-- install-doc: / { m = $0; sub(/^<!-- install-doc: /, "", m); sub(/ *-->.*$/, "", m); marker = m; next }
  /^```sh$/ {
    if (marker == "") { printf "docs/install.md:%d: a sh block with no install-doc marker\n", NR > "/dev/stderr"; bad = 1 }
    path = marker; sub(/ .*/, "", path); n[path]++; inblock = 1
    file = sprintf("%s/%s/%02d.sh", out, path, n[path]); system("mkdir -p " out "/" path)
    printf "# docs/install.md:%d\n", NR + 1 > file; marker = ""; next
  }
  /^```$/ && inblock { inblock = 0; close(file); next }
  inblock { print > file; next }
  { if ($0 !~ /^[[:space:]]*$/) marker = "" }
  END { exit bad }
' "$doc" || fail "docs/install.md has command blocks the test does not know what to do with"
for p in helm yaml; do [[ -d $work/$p ]] || fail "docs/install.md has no '$p' blocks"; done
skipped=$(find "$work/skip" -name '*.sh' 2>/dev/null | wc -l)

# What the user's cluster provides.
export PATH="$tools:$HARNESS_E2E_BIN:$PATH"
export HELM_CACHE_HOME=$work/helm/c HELM_CONFIG_HOME=$work/helm/f HELM_DATA_HOME=$work/helm/d
export IMAGE_REPOSITORY=localhost/harness-engine/operator IMAGE_TAG=dev NEW_TAG=dev-doc-upgrade
ctr_ images tag --force "$IMAGE_REPOSITORY:$IMAGE_TAG" "$IMAGE_REPOSITORY:$NEW_TAG" >/dev/null
pv_dir=${HARNESS_E2E_PV_ROOT:-$HARNESS_E2E_RUN/pv}/install-doc
volume() {
  K delete pv harness-engine-data-doc --ignore-not-found --timeout=60s >/dev/null
  node_sh "rm -rf '$pv_dir' && mkdir -p '$pv_dir' && chown 65532:65532 '$pv_dir'"
  K apply -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolume
metadata: {name: harness-engine-data-doc}
spec:
  capacity: {storage: 10Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  claimRef: {namespace: $NS, name: harness-engine-data}
  hostPath: {path: $pv_dir, type: Directory}
EOF
}
clean() { # what a path leaves on purpose (kept Secret and PVC, the namespace), removed
  K delete namespace $NS install-check --ignore-not-found --timeout=120s >/dev/null 2>&1 || true
  K delete pv harness-engine-data-doc --ignore-not-found --timeout=60s >/dev/null 2>&1 || true
}
clean

for p in helm yaml; do
  volume
  n=$(find "$work/$p" -name '*.sh' | wc -l)
  echo "install-doc: path '$p': $n blocks"
  started=$SECONDS
  cat "$work/$p"/*.sh >"$work/$p.session"
  (cd "$repo" && bash -eu "$work/$p.session") >"$work/$p.log" 2>&1 </dev/null || {
    tail -40 "$work/$p.log" >&2
    fail "docs/install.md, path '$p': a command failed (above)"
  }
  case $p in
    helm) K get crd harnessbindings.harness-engine.dev >/dev/null || fail "helm: uninstall must keep the CRDs"
          [[ -n $(K -n $NS get secret harness-engine-identity -o name 2>/dev/null) ]] || fail "helm: uninstall must keep the identity key" ;;
    yaml) ! K get crd harnessbindings.harness-engine.dev >/dev/null 2>&1 || fail "yaml: kubectl delete -f left the CRDs" ;;
  esac
  # The Deployment is gone; its pods follow through garbage collection and their grace.
  for _ in $(seq 120); do [[ -z $(K -n $NS get pods -o name 2>/dev/null) ]] && break; sleep 0.5; done
  [[ -z $(K -n $NS get pods -o name 2>/dev/null) ]] || fail "path '$p' left operator pods after 60s"
  echo "install-doc: path '$p' passed in $((SECONDS - started))s"
  clean
done
# The chart's CRDs go back for whatever runs next on this node.
K apply --server-side -f "$repo/charts/harness-engine/crds/" >/dev/null
echo "install-doc: docs/install.md ran as written ($skipped block(s) marked skip) in $((SECONDS - T0))s"
