#!/usr/bin/env bash
# Builds the local control plane from Go modules only (e2e/go.mod pins every version)
# into a cache outside the repository. The cache key covers go.mod, go.sum, this
# script and the Go version, so a second run is a no-op and any change rebuilds.
#
# Prints the cache's bin directory on stdout; progress goes to stderr.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
export GOTOOLCHAIN=local GOFLAGS=-mod=mod
cd "$here"

k8s_version=v1.37.2
key=$( { cat go.mod go.sum scripts/build.sh; go version; } | sha256sum | cut -c1-16)
cache_root=${HARNESS_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/harness-engine/e2e}
bin="$cache_root/$key/bin"
if [[ -f "$bin/.complete" ]]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$cache_root/$key"
staging=$(mktemp -d "$cache_root/$key/build.XXXXXX")
trap 'rm -rf "$staging"' EXIT

# Stamp the Kubernetes binaries: kubectl and the components parse their own --version.
minor=${k8s_version#v1.}; minor=${minor%%.*}
kver="-X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$k8s_version -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"

build() { # name package [extra ldflags]
  local name=$1 pkg=$2 extra=${3:-}
  local started=$SECONDS
  echo "build: $name ($pkg)" >&2
  go build -trimpath -ldflags "-s -w $extra" -o "$staging/$name" "$pkg"
  echo "build: $name done in $((SECONDS - started))s" >&2
}

# FerretDB's main package panics at start unless build/version/version.txt (made
# by its own release tooling, absent from the module zip) holds a version. Build
# it from a writable copy of the module with that file added, resolved through a
# throwaway copy of our go.mod so every dependency keeps the version go.sum pins.
build_ferretdb() {
  local started=$SECONDS src work
  echo "build: ferretdb (github.com/FerretDB/FerretDB/cmd/ferretdb, version.txt added)" >&2
  src=$(go list -m -f '{{.Dir}}' github.com/FerretDB/FerretDB)
  [[ -n "$src" && -d "$src" ]] || { echo "build: FerretDB's module is not in the module cache" >&2; return 1; }
  work=$(mktemp -d "$staging/.ferretdb.XXXXXX")
  cp -R "$src" "$work/src"
  chmod -R u+w "$work/src"
  go list -m -f '{{.Version}}' github.com/FerretDB/FerretDB >"$work/src/build/version/version.txt"
  mkdir "$work/mod"
  cp go.mod go.sum "$work/mod/"
  (cd "$work/mod" &&
    go mod edit -replace "github.com/FerretDB/FerretDB=$work/src" &&
    go build -trimpath -ldflags "-s -w" -o "$staging/ferretdb" github.com/FerretDB/FerretDB/cmd/ferretdb)
  rm -rf "$work"
  echo "build: ferretdb done in $((SECONDS - started))s" >&2
}

# `go build` fetches what the packages it builds import, but the two steps below read
# module directories straight from the module cache (FerretDB's source, Agent Sandbox's
# CRDs): download those modules first, or a cold cache answers with an empty path.
echo "build: go mod download" >&2
go mod download github.com/FerretDB/FerretDB sigs.k8s.io/agent-sandbox

build etcd go.etcd.io/etcd/server/v3
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$kver"
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$kver"
build kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler "$kver"
build kubectl k8s.io/kubernetes/cmd/kubectl "$kver"
build kwok sigs.k8s.io/kwok/cmd/kwok "-X sigs.k8s.io/kwok/pkg/consts.Version=v0.8.0 -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=$k8s_version"
build agent-sandbox-controller sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller
build_ferretdb

# The Agent Sandbox CRDs ship inside its module; keep them next to the binaries so
# `up` installs exactly the API this controller serves.
mkdir -p "$staging/agent-sandbox-crds"
asdir=$(go list -m -f '{{.Dir}}' sigs.k8s.io/agent-sandbox)
[[ -n "$asdir" && -d "$asdir/k8s/crds" ]] || { echo "build: Agent Sandbox's module has no k8s/crds in the module cache" >&2; exit 1; }
cp "$asdir"/k8s/crds/*.yaml "$staging/agent-sandbox-crds/"
chmod -R u+w "$staging"

touch "$staging/.complete"
rm -rf "$bin"
mv "$staging" "$bin"
trap - EXIT
echo "$bin"
