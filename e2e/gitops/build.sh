#!/usr/bin/env bash
# Builds gitops-check (gopher-lua, kstatus, cel-go; pinned by go.mod and go.sum) into a
# cache outside the repository and prints the binary's path on stdout. The modules are
# downloaded first, so a cold module cache works; the cache key covers the sources, this
# script and the Go version, so a second run is a no-op and any change rebuilds.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export GOTOOLCHAIN=local GOFLAGS=-mod=mod
cd "$here"
key=$( { cat go.mod go.sum build.sh ./*.go; go version; } | sha256sum | cut -c1-16)
cache_root=${HARNESS_GITOPS_CHECK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/harness-engine/gitops-check}
bin="$cache_root/$key/gitops-check"
if [[ -x "$bin" ]]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$cache_root/$key"
staging=$(mktemp "$cache_root/$key/gitops-check.XXXXXX")
trap 'rm -f "$staging"' EXIT
echo "build: gitops-check (go mod download)" >&2
go mod download
echo "build: gitops-check" >&2
go build -trimpath -ldflags "-s -w" -o "$staging" .
chmod 0755 "$staging"
mv "$staging" "$bin"
trap - EXIT
echo "$bin"
