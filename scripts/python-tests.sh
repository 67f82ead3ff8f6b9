#!/usr/bin/env bash
# Runs every Python suite (clients/python/tests) against a live `harness-engine serve`:
# LangGraph's checkpoint conformance suite, the Claude Agent SDK's session-store
# conformance suite, the Strands agent loop, the two-writer fencing tests, the client
# tests and the Deep Agents example.
#
# Makes the venv target/python-venv from the pinned lock (scripts/python-env.sh), builds
# the server (unless HARNESS_ENGINE_BIN names one), starts it on free ports in a temp
# data dir, runs pytest, and stops the server.
#
#   scripts/python-tests.sh                 # all suites
#   scripts/python-tests.sh -k conformance  # extra arguments go to pytest
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
target_dir=${CARGO_TARGET_DIR:-$repo/target}
log() { printf 'python-tests.sh: %s\n' "$*" >&2; }

source "$repo/scripts/python-env.sh"

bin=${HARNESS_ENGINE_BIN:-}
if [[ -z $bin ]]; then
  (cd "$repo" && cargo build --locked --quiet --bin harness-engine)
  bin=$target_dir/debug/harness-engine
fi

work=$(mktemp -d)
server_pid=
cleanup() {
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Port 0: the server picks free ports and prints what it bound. The suites write in
# bursts, so the per-binding write limit is raised (the client retries 429s anyway).
"$bin" serve --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --data-dir "$work/data" \
  --memory-policy "$repo/tests/fixtures/memory_policy_all_agents.yaml" \
  --writes-per-second 5000 --write-burst 10000 >"$work/serve.out" 2>"$work/serve.err" &
server_pid=$!

api= admin= token=
for _ in $(seq 1 300); do
  banner=$(cat "$work/serve.out")
  api=$(sed -n 's/^api: \([^ ]*\).*/\1/p' <<<"$banner")
  admin=$(sed -n 's/^admin: \([^ ]*\).*/\1/p' <<<"$banner")
  token=$(sed -n 's/^token: //p' <<<"$banner")
  [[ -n $admin ]] && curl -fsS --max-time 2 "$admin/ready" >/dev/null 2>&1 && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/serve.err" >&2; log "serve exited"; exit 1; }
  sleep 0.1
done
[[ -n $api && -n $token ]] || { cat "$work/serve.err" >&2; log "serve did not come up"; exit 1; }
printf '%s' "$token" >"$work/token"
log "serve at $api (data $work/data); running the Python suites with $("$python_venv" --version)"

status=0
HARNESS_ENGINE_TEST_ENDPOINT=$api \
  HARNESS_ENGINE_TEST_TOKEN_FILE=$work/token \
  HARNESS_ENGINE_TEST_DATA_DIR=$work/data \
  HARNESS_ENGINE_BIN=$bin \
  "$python_venv" -m pytest "$repo/clients/python/tests" -q -p no:cacheprovider "$@" || status=$?

if grep -q panicked "$work/serve.err"; then
  log "the server reported a panic:"
  cat "$work/serve.err" >&2
  status=1
fi
exit "$status"
