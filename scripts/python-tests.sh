#!/usr/bin/env bash
# Runs every Python suite (clients/python/tests) against a live `harness-engine serve`:
# LangGraph's checkpoint conformance suite, the Claude Agent SDK's session-store
# conformance suite, the Strands agent loop, the two-writer fencing tests, the client
# tests, the effect and refund tests and the Deep Agents example; then the effect,
# refund and fencing tests again on a `serve` backed by FerretDB.
#
# Makes the venv target/python-venv from the pinned lock (scripts/python-env.sh), builds
# the server (unless HARNESS_ENGINE_BIN names one), starts it on free ports in a temp
# data dir, runs pytest, and stops every process it started.
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
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_serve NAME [serve flags...]: starts `serve` on free ports (port 0: the server
# picks and prints what it bound) with its data in $work/NAME, waits for /ready, and
# sets $api, $token and $data. The suites write in bursts, so the per-binding write
# limit is raised (the client retries 429s anyway).
start_serve() {
  local name=$1 banner admin=
  shift
  data=$work/$name/data
  mkdir -p "$work/$name"
  "$bin" serve --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --data-dir "$data" \
    --memory-policy "$repo/tests/fixtures/memory_policy_all_agents.yaml" \
    --writes-per-second 5000 --write-burst 10000 "$@" \
    >"$work/$name/serve.out" 2>"$work/$name/serve.err" &
  local pid=$!
  pids+=("$pid")
  api= token=
  for _ in $(seq 1 300); do
    banner=$(cat "$work/$name/serve.out")
    api=$(sed -n 's/^api: \([^ ]*\).*/\1/p' <<<"$banner")
    admin=$(sed -n 's/^admin: \([^ ]*\).*/\1/p' <<<"$banner")
    token=$(sed -n 's/^token: //p' <<<"$banner")
    [[ -n $admin ]] && curl -fsS --max-time 2 "$admin/ready" >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || { cat "$work/$name/serve.err" >&2; log "serve ($name) exited"; exit 1; }
    sleep 0.1
  done
  [[ -n $api && -n $token ]] || { cat "$work/$name/serve.err" >&2; log "serve ($name) did not come up"; exit 1; }
  printf '%s' "$token" >"$work/$name/token"
}

status=0
run_suites() { # NAME [pytest arguments...]
  local name=$1
  shift
  HARNESS_ENGINE_TEST_ENDPOINT=$api \
    HARNESS_ENGINE_TEST_TOKEN_FILE=$work/$name/token \
    HARNESS_ENGINE_TEST_DATA_DIR=$data \
    HARNESS_ENGINE_TEST_MEMORY_POLICY=$repo/tests/fixtures/memory_policy_all_agents.yaml \
    HARNESS_ENGINE_BIN=$bin \
    "$python_venv" -m pytest -q -p no:cacheprovider "$@" || status=$?
  if grep -q panicked "$work/$name/serve.err"; then
    log "the server ($name) reported a panic:"
    cat "$work/$name/serve.err" >&2
    status=1
  fi
}

# Pass 1: every suite, on the embedded store (SQLite).
start_serve sqlite
log "serve at $api (data $data); running the Python suites with $("$python_venv" --version)"
run_suites sqlite "$repo/clients/python/tests" "$@"

# Pass 2: the effect, refund, fencing and MCP suites on MongoDB: FerretDB (built with the
# control plane by e2e/scripts/build.sh, SQLite underneath) on free ports of its own.
# PYTHON_TESTS_MONGODB=0 skips it.
if [[ ${PYTHON_TESTS_MONGODB:-1} != 0 ]]; then
  e2e_bin=$("$repo/e2e/scripts/build.sh")
  free_port() { "$python_venv" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
  mongo_port=$(free_port) ferret_debug_port=$(free_port)
  mkdir -p "$work/ferretdb"
  "$e2e_bin/ferretdb" --handler=sqlite --sqlite-url="file:$work/ferretdb/" \
    --state-dir="$work/ferretdb" --listen-addr="127.0.0.1:$mongo_port" \
    --debug-addr="127.0.0.1:$ferret_debug_port" --telemetry=disable --log-level=warn \
    >"$work/ferretdb.log" 2>&1 &
  pids+=("$!")
  for _ in $(seq 1 300); do
    "$python_venv" -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1).close()' \
      "$mongo_port" 2>/dev/null && break
    sleep 0.1
  done
  mongo_uri="mongodb://127.0.0.1:$mongo_port/"
  start_serve mongodb --mongodb-uri "$mongo_uri" --mongodb-database harness_engine_python
  log "serve at $api on FerretDB ($mongo_uri); the effect, refund, fencing and MCP suites again"
  HARNESS_ENGINE_TEST_MONGODB_URI=$mongo_uri HARNESS_ENGINE_TEST_MONGODB_DATABASE=harness_engine_python \
    run_suites mongodb \
    "$repo/clients/python/tests/test_effects.py" \
    "$repo/clients/python/tests/test_langgraph_effects.py" \
    "$repo/clients/python/tests/test_refund_e2e.py" \
    "$repo/clients/python/tests/test_langgraph_fencing.py" \
    "$repo/clients/python/tests/test_mcp.py" "$@"
fi
exit "$status"
