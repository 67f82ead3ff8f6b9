#!/usr/bin/env bash
# Runs the MCP conformance suite published by the protocol's maintainers
# (@modelcontextprotocol/conformance, from npm at a pinned version, installed once into
# the e2e cache) against /mcp of a `harness-engine serve` it starts on free ports in a
# temp dir, then stops everything it started.
#
# The scenarios that apply to a tools-only server (no resources, prompts, completions,
# logging, sampling or elicitation; stateless Streamable HTTP with JSON responses) are
# run and must all pass; the others test fixture tools or capabilities Harness Engine
# does not offer (docs/mcp.md "Conformance" lists them and why).
#
#   scripts/mcp-conformance.sh                      # uses target/debug/harness-engine
#   HARNESS_ENGINE_BIN=path scripts/mcp-conformance.sh
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
version=0.1.16
scenarios=(server-initialize ping tools-list dns-rebinding-protection)
target_dir=${CARGO_TARGET_DIR:-$repo/target}
bin=${HARNESS_ENGINE_BIN:-$target_dir/debug/harness-engine}
cache_root=${HARNESS_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/harness-engine/e2e}
suite=$cache_root/mcp-conformance-$version

log() { printf 'mcp-conformance.sh: %s\n' "$*" >&2; }

command -v node >/dev/null && command -v npm >/dev/null || { log "node and npm are needed (apt-get install nodejs npm)"; exit 1; }
[[ -x $bin ]] || (cd "$repo" && cargo build --locked --quiet)

cli=$suite/node_modules/@modelcontextprotocol/conformance/dist/index.js
if [[ ! -f $cli ]]; then
  log "installing @modelcontextprotocol/conformance@$version into $suite"
  mkdir -p "$suite.tmp"
  npm install --prefix "$suite.tmp" --no-audit --no-fund --loglevel=error \
    "@modelcontextprotocol/conformance@$version" >&2
  rm -rf "$suite" && mv "$suite.tmp" "$suite"
fi
node_args=()
# Node < 22 lacks fs.globSync, which the suite's bundle imports (see node20-hooks.mjs).
if ! node -e 'process.exit(typeof require("fs").globSync === "function" ? 0 : 1)'; then
  node_args=(--import "$repo/scripts/mcp-conformance/node20-register.mjs")
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/harness-mcp-conformance.XXXXXX")
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$bin" serve --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --data-dir "$work/data" \
  >"$work/serve.out" 2>"$work/serve.err" &
pids+=("$!")
api= admin= token=
for _ in $(seq 1 300); do
  banner=$(cat "$work/serve.out")
  api=$(sed -n 's/^api: \([^ ]*\).*/\1/p' <<<"$banner")
  admin=$(sed -n 's/^admin: \([^ ]*\).*/\1/p' <<<"$banner")
  token=$(sed -n 's/^token: //p' <<<"$banner")
  [[ -n $admin ]] && curl -fsS --max-time 2 "$admin/ready" >/dev/null 2>&1 && break
  kill -0 "${pids[0]}" 2>/dev/null || { cat "$work/serve.err" >&2; log "serve exited"; exit 1; }
  sleep 0.1
done
[[ -n $api && -n $token ]] || { cat "$work/serve.err" >&2; log "serve did not come up"; exit 1; }
printf '%s' "$token" >"$work/token"

python3 "$repo/scripts/mcp-conformance/bearer_proxy.py" "$api" "$work/token" "$work/proxy.port" &
pids+=("$!")
for _ in $(seq 1 100); do [[ -s $work/proxy.port ]] && break; sleep 0.05; done
[[ -s $work/proxy.port ]] || { log "the bearer proxy did not start"; exit 1; }
url="http://127.0.0.1:$(cat "$work/proxy.port")/mcp"

log "suite $version against $api/mcp (through a bearer-token proxy): ${scenarios[*]}"
failed=0
for scenario in "${scenarios[@]}"; do
  if node "${node_args[@]}" "$cli" server --url "$url" --scenario "$scenario" \
    >"$work/$scenario.log" 2>&1; then
    log "$scenario: $(grep -o 'Passed: [^,]*, [0-9]* failed' "$work/$scenario.log" | tail -1)"
  else
    log "$scenario: FAILED"
    cat "$work/$scenario.log" >&2
    failed=1
  fi
done
if grep -q panicked "$work/serve.err"; then
  log "the server reported a panic:"
  cat "$work/serve.err" >&2
  failed=1
fi
exit "$failed"
