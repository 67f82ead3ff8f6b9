#!/usr/bin/env bash
# Fuzzes the data-plane API with schemathesis against the committed OpenAPI document
# (docs/openapi.json): starts `harness-engine serve` on free ports in a temp dir, runs a
# bounded number of generated requests per operation, and stops the server.
#
# Fails on any 5xx, and on any response (status, content type, headers, body) that the
# document does not describe. Schemathesis comes from PyPI at a pinned version, into a
# venv under target/ (created once, reused).
#
#   scripts/schemathesis.sh                 # uses target/debug/harness-engine (builds it)
#   HARNESS_ENGINE_BIN=path scripts/schemathesis.sh
#   SCHEMATHESIS_MAX_EXAMPLES=200 scripts/schemathesis.sh   # a longer run
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
version=4.32.5
max_examples=${SCHEMATHESIS_MAX_EXAMPLES:-60}
venv=$repo/target/schemathesis-venv
target_dir=${CARGO_TARGET_DIR:-$repo/target}

log() { printf 'schemathesis.sh: %s\n' "$*" >&2; }

# CPython 3.11 before 3.11.8 can fail inside hypothesis with "AST constructor recursion
# depth mismatch" (a CPython bug, fixed later); prefer a newer interpreter when present.
python=
candidates=(python3.13 python3.12)
if command -v pyenv >/dev/null 2>&1; then
  for p in "$(pyenv root)"/versions/3.1[2-9]*/bin/python3; do
    [[ -x $p ]] && candidates=("$p" "${candidates[@]}")
  done
fi
candidates+=(python3)
for candidate in "${candidates[@]}"; do
  if "$candidate" -c 'import sys, venv; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1; then
    python=$candidate
    break
  fi
done
[[ -n $python ]] || { log "no Python 3.10+ found"; exit 1; }

want_python=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
have() { "$venv/bin/python" -c "$1" 2>/dev/null; }
if [[ $(have 'import importlib.metadata as m; print(m.version("schemathesis"))') != "$version" ]] ||
  [[ $(have 'import sys; print("%d.%d" % sys.version_info[:2])') != "$want_python" ]]; then
  log "installing schemathesis $version into $venv (Python $want_python)"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$version"
fi

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

# Port 0: the server picks free ports and prints what it bound.
"$bin" serve --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --data-dir "$work/data" \
  --memory-policy "$repo/tests/fixtures/memory_policy_all_agents.yaml" \
  >"$work/serve.out" 2>"$work/serve.err" &
server_pid=$!

api= admin= token=
for _ in $(seq 1 200); do
  # One snapshot per try: the server may be mid-way through printing its banner.
  banner=$(cat "$work/serve.out")
  api=$(sed -n 's/^api: \([^ ]*\).*/\1/p' <<<"$banner")
  admin=$(sed -n 's/^admin: \([^ ]*\).*/\1/p' <<<"$banner")
  token=$(sed -n 's/^token: //p' <<<"$banner")
  [[ -n $admin ]] && curl -fsS --max-time 2 "$admin/ready" >/dev/null 2>&1 && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/serve.err" >&2; log "serve exited"; exit 1; }
  sleep 0.1
done
[[ -n $api && -n $token ]] || { cat "$work/serve.err" >&2; log "serve did not come up"; exit 1; }

# One real binding of the token's subject, so generated requests also reach the store
# paths, not only the "no such binding" path.
binding=$(curl -fsS -X POST "$api/v1/bindings" -H "Authorization: Bearer $token" \
  -H 'Idempotency-Key: schemathesis-seed' -H 'Content-Type: application/json' \
  -d '{"agent_id":"agent-fuzz","conversation_id":"conv-fuzz","harness":"strands"}' |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["binding_id"])')
log "serve at $api, seeded binding $binding, $max_examples examples per operation"

# A fixed binding id (the seeded one), so generated requests get past "no such binding"
# into the store; the fence headers' examples (epoch 0, generation 1) match it. Extra, undocumented parameters are not generated: HTTP
# servers ignore unknown headers by design (proxies add them), and so does this one.
cat >"$work/schemathesis.toml" <<TOML
[generation]
allow-extra-parameters = false

[parameters]
binding_id = "$binding"
TOML

# Checks: every check that judges a single response against the document. Excluded:
# positive_data_acceptance (schema-valid input is still refused when it names a binding
# or object that does not exist, or breaks a rule the schema cannot express, such as a
# stale revision), and the stateful checks, which need links this document does not
# declare.
cd "$work"
status=0
"$venv/bin/schemathesis" --config-file "$work/schemathesis.toml" run "$repo/docs/openapi.json" \
  --url "$api" \
  -H "Authorization: Bearer $token" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance,negative_data_rejection,missing_required_header,unsupported_method \
  --phases examples,coverage,fuzzing \
  --max-examples "$max_examples" \
  --seed 20240501 \
  --workers 2 \
  --request-timeout 20 \
  --no-shrink \
  --suppress-health-check all \
  --warnings off || status=$?

if grep -q panicked "$work/serve.err"; then
  log "the server reported a panic:"
  cat "$work/serve.err" >&2
  status=1
fi
exit "$status"
