#!/usr/bin/env bash
# Builds the fuzz targets of fuzz/ with the nightly toolchain (libFuzzer through
# libfuzzer-sys, the coverage instrumentation cargo-fuzz uses) and runs each for
# FUZZ_SECONDS (default 60) on its committed corpus (fuzz/corpus/<target>, new inputs
# kept in a temporary copy unless FUZZ_KEEP=1). A crash keeps its input under
# target/fuzz/artifacts/<target>/ and fails the run.
#
#   scripts/fuzz.sh                      # every target, 60 s each
#   FUZZ_SECONDS=600 scripts/fuzz.sh api_json memory_scanner
#   FUZZ_JOBS=2 ...                      # run that many targets at once
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
seconds=${FUZZ_SECONDS:-60}
jobs=${FUZZ_JOBS:-1}
target_dir=${CARGO_TARGET_DIR:-$repo/target}/fuzz
log() { printf 'fuzz.sh: %s\n' "$*" >&2; }

if ! rustup toolchain list | grep -q '^nightly'; then
  log "the nightly toolchain is needed (rustup toolchain install nightly)"
  exit 1
fi
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  mapfile -t targets < <(sed -n 's/^name = "\([a-z_]*\)"$/\1/p' "$repo/fuzz/Cargo.toml" | grep -v '^harness-engine-fuzz$')
fi

export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing"
# An explicit --target keeps the instrumentation out of build scripts and proc macros.
triple=$(rustc +nightly -vV | sed -n 's/^host: //p')
log "building ${#targets[@]} targets (nightly, release with debug assertions)"
cargo +nightly build --locked --release --quiet --manifest-path "$repo/fuzz/Cargo.toml" \
  --target "$triple" --target-dir "$target_dir" $(printf -- '--bin %s ' "${targets[@]}")
bin_dir=$target_dir/$triple/release

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
run_one() {
  local t=$1 corpus=$repo/fuzz/corpus/$1 live
  mkdir -p "$corpus" "$target_dir/artifacts/$t"
  if [[ ${FUZZ_KEEP:-0} == 1 ]]; then live=$corpus; else live=$work/$t; cp -r "$corpus" "$live"; fi
  "$bin_dir/$t" "$live" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$target_dir/artifacts/$t/" -print_final_stats=1 >"$work/$t.log" 2>&1
}
summary() {
  local t=$1 rc=$2 runs cov
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t.log" | tail -1 || true)
  cov=$(grep -o 'cov: [0-9]*' "$work/$t.log" | tail -1 || true)
  if [[ $rc -eq 0 ]]; then
    log "$t: ${runs:-?} runs in ${seconds}s, ${cov:-cov: ?}, no crash"
  else
    log "$t: FAILED (exit $rc); the input is in $target_dir/artifacts/$t/"
    tail -40 "$work/$t.log" >&2
  fi
}
running=()
for t in "${targets[@]}"; do
  run_one "$t" & running+=("$!:$t")
  if [[ ${#running[@]} -ge $jobs ]]; then
    entry=${running[0]}; running=("${running[@]:1}")
    rc=0; wait "${entry%%:*}" || rc=$?
    summary "${entry#*:}" "$rc"; [[ $rc -eq 0 ]] || status=1
  fi
done
for entry in "${running[@]}"; do
  rc=0; wait "${entry%%:*}" || rc=$?
  summary "${entry#*:}" "$rc"; [[ $rc -eq 0 ]] || status=1
done
exit "$status"
