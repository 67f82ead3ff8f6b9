# shellcheck shell=bash
# Shared helpers for up.sh and down.sh; sourced, never run.
#
# Everything a control plane owns lives under one run directory:
#   $RUN/pids/<component>.pid   process ids written by the processes themselves
#   $RUN/logs/<component>.log   stdout+stderr of each component
#   $RUN/certs, $RUN/etcd, $RUN/ferretdb, ...
# The run directory defaults to <repo>/target/e2e and can be moved with
# HARNESS_E2E_RUN. Every component's command line names a path inside it, which
# is how down.sh finds strays that never got a pid file.

E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPO_DIR=$(dirname "$E2E_DIR")
RUN=${HARNESS_E2E_RUN:-$REPO_DIR/target/e2e}
mkdir -p "$RUN"
RUN=$(cd "$RUN" && pwd -P)

log() { printf '%s\n' "$*" >&2; }

# pid_alive PID: the process exists and is not a zombie.
pid_alive() {
  local pid=$1 state
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [[ -r /proc/$pid/stat ]] || return 1
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [[ -n $state && $state != Z ]]
}

# pid_owned PID: alive and its command line references this run directory,
# which guards against acting on a recycled pid.
pid_owned() {
  local pid=$1 arg
  pid_alive "$pid" || return 1
  while IFS= read -r -d '' arg; do
    case $arg in
      "$RUN" | "$RUN"/* | *[=:,@]"$RUN" | *[=:,@]"$RUN"/*) return 0 ;;
    esac
  done 2>/dev/null <"/proc/$pid/cmdline"
  return 1
}

# stray_pids: every process (other than this shell and its ancestors) whose
# command line references the run directory.
stray_pids() {
  local self=" " p=$$ pid
  while [[ $p =~ ^[0-9]+$ && $p -gt 1 ]]; do
    self+="$p "
    p=$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null) || break
  done
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    [[ $self == *" $pid "* ]] && continue
    pid_owned "$pid" && echo "$pid"
  done
  return 0
}

# stop_pids PID...: SIGTERM, wait up to 10 s, then SIGKILL whatever is left.
stop_pids() {
  local pids=("$@") pid left i
  ((${#pids[@]})) || return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    left=()
    for pid in "${pids[@]}"; do pid_alive "$pid" && left+=("$pid"); done
    ((${#left[@]})) || return 0
    sleep 0.1
  done
  log "down: SIGKILL ${left[*]}"
  kill -KILL "${left[@]}" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    left=()
    for pid in "${pids[@]}"; do pid_alive "$pid" && left+=("$pid"); done
    ((${#left[@]})) || return 0
    sleep 0.1
  done
  return 0
}
