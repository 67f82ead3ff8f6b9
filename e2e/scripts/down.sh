#!/usr/bin/env bash
# Stops the local control plane started by up.sh from this run directory
# (${HARNESS_E2E_RUN:-<repo>/target/e2e}).
#
# Kills every process named in $RUN/pids/*.pid, then any stray process whose
# command line still references the run directory (a crashed `up` leaves
# nothing behind), each with SIGTERM, up to 10 s grace, then SIGKILL.
# Removes etcd data, pid files and per-run state but keeps $RUN/logs for
# post-mortems. Safe to run when nothing is up.
#
# Usage: down.sh [--purge]   --purge also deletes the whole run directory.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

purge=false
for arg in "$@"; do
  case $arg in
    --purge) purge=true ;;
    -h | --help)
      sed -n '2,11p' "$0" | cut -c3-
      exit 0
      ;;
    *)
      log "down: unknown argument: $arg"
      exit 2
      ;;
  esac
done

# Recorded processes first, in reverse start order so clients go before the
# apiserver and the apiserver before etcd.
pids=()
if [[ -d $RUN/pids ]]; then
  for name in ferretdb agent-sandbox-controller kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do
    f=$RUN/pids/$name.pid
    [[ -f $f ]] || continue
    pid=$(<"$f")
    pid_owned "$pid" && pids+=("$pid")
  done
  # Anything else with a pid file (a component added later, say).
  for f in "$RUN"/pids/*.pid; do
    [[ -f $f ]] || continue
    pid=$(<"$f")
    [[ " ${pids[*]} " == *" $pid "* ]] && continue
    pid_owned "$pid" && pids+=("$pid")
  done
fi
for pid in "${pids[@]}"; do
  stop_pids "$pid"
done

# Strays: clients first, then the apiserver, then etcd, so that nothing waits
# on a backend that is already gone.
mapfile -t strays < <(stray_pids)
if ((${#strays[@]})); then
  log "down: stopping stray processes: ${strays[*]}"
  clients=() apiservers=() etcds=()
  for pid in "${strays[@]}"; do
    case $(cat "/proc/$pid/comm" 2>/dev/null) in
      etcd) etcds+=("$pid") ;;
      kube-apiserver) apiservers+=("$pid") ;;
      *) clients+=("$pid") ;;
    esac
  done
  stop_pids "${clients[@]}"
  stop_pids "${apiservers[@]}"
  stop_pids "${etcds[@]}"
fi
mapfile -t strays < <(stray_pids)
if ((${#strays[@]})); then
  log "down: processes still running after SIGKILL: ${strays[*]}"
  exit 1
fi

if $purge; then
  rm -rf "$RUN"
  log "down: removed $RUN"
else
  rm -rf "$RUN/pids" "$RUN/etcd" "$RUN/ferretdb" "$RUN/kwok" "$RUN/tmp" "$RUN/certs" \
    "$RUN/env" "$RUN/kubeconfig" "$RUN/mongodb-uri"
  log "down: stopped (logs kept in $RUN/logs)"
fi
