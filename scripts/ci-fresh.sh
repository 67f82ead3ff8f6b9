#!/usr/bin/env bash
# `make ci-fresh`: prove a cold start. Clones HEAD into a temporary directory and runs
# `.ci/run` there with empty Go module and build caches, an empty e2e cache and an empty
# Cargo target directory, as on a machine that has only the toolchains. Only committed
# work is tested (uncommitted changes are not in the clone).
#
# KEEP=1 keeps the directory afterwards (its path is printed); the default removes it.
set -euo pipefail
repo=$(git rev-parse --show-toplevel)
root=$(mktemp -d "${TMPDIR:-/tmp}/harness-ci-fresh.XXXXXX")
cleanup() {
  local rc=$?
  if [[ "${KEEP:-0}" == 1 ]]; then
    echo "ci-fresh: kept $root" >&2
  else
    # The clone's control plane, if a failure left one up, goes first.
    [[ -x "$root/clone/e2e/scripts/down.sh" ]] && HARNESS_E2E_RUN="$root/clone/target/e2e" "$root/clone/e2e/scripts/down.sh" >/dev/null 2>&1 || true
    [[ -d "$root/clone/target/e2e-node" ]] && "$root/clone/e2e/scripts/realnode.sh" down >/dev/null 2>&1 || true
    chmod -R u+w "$root" 2>/dev/null || true # the Go module cache is read-only
    rm -rf "$root"
  fi
  exit "$rc"
}
trap cleanup EXIT

git clone --quiet --no-local "$repo" "$root/clone"
git -C "$root/clone" checkout --quiet "$(git -C "$repo" rev-parse HEAD)"
mkdir -p "$root/gomod" "$root/gocache" "$root/e2e-cache" "$root/cargo-target" "$root/pip-cache" "$root/npm-cache"
echo "ci-fresh: $(git -C "$repo" rev-parse --short HEAD) in $root (GOMODCACHE, GOCACHE, HARNESS_E2E_CACHE, CARGO_TARGET_DIR, pip and npm caches all empty)" >&2

started=$SECONDS
(
  cd "$root/clone"
  env GOMODCACHE="$root/gomod" GOCACHE="$root/gocache" HARNESS_E2E_CACHE="$root/e2e-cache" \
    CARGO_TARGET_DIR="$root/cargo-target" PIP_CACHE_DIR="$root/pip-cache" \
    npm_config_cache="$root/npm-cache" .ci/run
)
echo "ci-fresh: passed in $((SECONDS - started))s" >&2
