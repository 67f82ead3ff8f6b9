#!/usr/bin/env bash
# Builds kubelet and kube-proxy for the real-node tier from the same Go modules as the
# control plane: k8s.io/kubernetes at the version e2e/go.mod pins, resolved through a
# throwaway copy of e2e/go.mod and go.sum (so no pinned version moves and build.sh's cache
# key is untouched), stamped like build.sh stamps the other components. Cached in
# ${HARNESS_E2E_CACHE:-~/.cache/harness-engine/e2e}/node-<key>/bin; prints that directory.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
export GOTOOLCHAIN=local GOFLAGS=-mod=mod
cd "$here"

k8s_version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
key=$( { cat go.mod go.sum scripts/build-node.sh; go version; } | sha256sum | cut -c1-16)
cache_root=${HARNESS_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/harness-engine/e2e}
bin="$cache_root/node-$key/bin"
if [[ -f "$bin/.complete" ]]; then echo "$bin"; exit 0; fi
mkdir -p "$cache_root/node-$key"
staging=$(mktemp -d "$cache_root/node-$key/build.XXXXXX")
trap 'rm -rf "$staging"' EXIT
minor=${k8s_version#v1.}; minor=${minor%%.*}
kver="-X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$k8s_version -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
mod=$(mktemp -d "$staging/.mod.XXXXXX")
cp go.mod go.sum "$mod/"
for name in kubelet kube-proxy; do
  started=$SECONDS
  echo "build-node: $name ($k8s_version)" >&2
  (cd "$mod" && go build -trimpath -ldflags "-s -w $kver" -o "$staging/$name" "k8s.io/kubernetes/cmd/$name")
  echo "build-node: $name done in $((SECONDS - started))s" >&2
done
rm -rf "$mod"
touch "$staging/.complete"
rm -rf "$bin"; mv "$staging" "$bin"; trap - EXIT
echo "$bin"
