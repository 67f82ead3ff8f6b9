#!/usr/bin/env bash
# Builds the tools the chart tests use (helm) from Go modules, each in its own module
# under e2e/tools/ (helm's go.mod would move modules the control plane shares), into
# the same cache as build.sh: ${HARNESS_E2E_CACHE:-~/.cache/harness-engine/e2e}/tools-<key>/bin.
# The key covers every tool module, this script and the Go version: a second run is a
# no-op. A cold build of helm takes about 4 minutes.
#
# Prints the bin directory on stdout; progress goes to stderr.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
export GOTOOLCHAIN=local GOFLAGS=-mod=mod
cd "$here"

helm_version=v4.3.2
key=$( { cat tools/helm/go.mod tools/helm/go.sum scripts/build-tools.sh; go version; } | sha256sum | cut -c1-16)
cache_root=${HARNESS_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/harness-engine/e2e}
bin="$cache_root/tools-$key/bin"
if [[ -f "$bin/.complete" ]]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$cache_root/tools-$key"
staging=$(mktemp -d "$cache_root/tools-$key/build.XXXXXX")
trap 'rm -rf "$staging"' EXIT

started=$SECONDS
echo "build-tools: helm $helm_version" >&2
(cd tools/helm && go build -trimpath -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$helm_version" \
  -o "$staging/helm" helm.sh/helm/v4/cmd/helm)
echo "build-tools: helm done in $((SECONDS - started))s" >&2

touch "$staging/.complete"
rm -rf "$bin"
mv "$staging" "$bin"
trap - EXIT
echo "$bin"
