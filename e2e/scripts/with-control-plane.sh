#!/usr/bin/env bash
# Runs a command against a fresh local control plane and always tears it down.
#
#   e2e/scripts/with-control-plane.sh cargo test
#
# The control plane lives in its own run directory (HARNESS_E2E_RUN, default
# target/e2e-test), apart from the one `make dev` uses, so a test run never stops a
# developer's cluster. The command gets KUBECONFIG, HARNESS_E2E_MONGODB_URI,
# HARNESS_E2E_BIN and HARNESS_E2E_ENV (the env file) in its environment.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export HARNESS_E2E_RUN=${HARNESS_E2E_RUN:-$repo/target/e2e-test}

cleanup() { "$here/down.sh" || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM

"$here/up.sh"
export HARNESS_E2E_ENV="$HARNESS_E2E_RUN/env"
# shellcheck disable=SC1090
source "$HARNESS_E2E_ENV"
"$@"
