#!/usr/bin/env bash
# `make bench-python`: one LangGraph graph run N times against HarnessCheckpointSaver
# (a release `harness-engine serve`), SqliteSaver and PostgresSaver (a PostgreSQL
# cluster the benchmark creates and stops; installed from Debian's packages when
# missing and running as root). Prints a table; writes target/bench/python.json.
#
#   scripts/bench-python.sh               # BENCH_RUNS=300 by default
#   BENCH_RUNS=50 scripts/bench-python.sh # a short smoke run
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
target_dir=${CARGO_TARGET_DIR:-$repo/target}
source "$repo/scripts/python-env.sh"
bin=${HARNESS_ENGINE_BIN:-}
if [[ -z $bin ]]; then
  (cd "$repo" && cargo build --locked --release --quiet --bin harness-engine)
  bin=$target_dir/release/harness-engine
fi
exec "$python_venv" "$repo/clients/python/bench/bench_checkpointers.py" --binary "$bin" "$@"
