#!/usr/bin/env bash
# Sourced by the Python scripts: finds Python >= 3.12 and makes the venv
# target/python-venv with the pinned dependencies (clients/python/requirements.lock)
# and the harness_engine package (editable). The venv is reused while the lock file
# and the interpreter are unchanged. Sets $venv and $python_venv.
repo=${repo:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
venv=$repo/target/python-venv
lock=$repo/clients/python/requirements.lock

pyenv_log() { printf 'python-env: %s\n' "$*" >&2; }

python=
candidates=(python3.13 python3.12)
if command -v pyenv >/dev/null 2>&1; then
  for p in "$(pyenv root)"/versions/3.1[2-9]*/bin/python3; do
    [[ -x $p ]] && candidates=("$p" "${candidates[@]}")
  done
fi
candidates+=(python3)
for candidate in "${candidates[@]}"; do
  if "$candidate" -c 'import sys, venv; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; then
    python=$candidate
    break
  fi
done
[[ -n $python ]] || { pyenv_log "no Python 3.12+ found (pyenv install 3.13, or apt-get install python3.12)"; exit 1; }

want="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])') $(sha256sum "$lock" | cut -c1-16)"
marker=$venv/.harness-engine-env
if [[ ! -x $venv/bin/python ]] || [[ "$(cat "$marker" 2>/dev/null)" != "$want" ]]; then
  pyenv_log "installing the pinned Python dependencies into $venv ($want)"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$lock"
  echo "$want" >"$marker"
fi
# The package itself, without touching the pinned dependencies.
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps -e "$repo/clients/python"
python_venv=$venv/bin/python
