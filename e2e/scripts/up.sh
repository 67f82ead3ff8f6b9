#!/usr/bin/env bash
# Starts Harness Engine's local e2e control plane: a real etcd, kube-apiserver,
# kube-controller-manager and kube-scheduler, kwok faking three nodes (so pods
# "run" without a container runtime), the Agent Sandbox controller with its
# CRDs, and FerretDB on SQLite as the MongoDB endpoint.
#
# Binaries come from scripts/build.sh (cached outside the repo), or from
# $HARNESS_E2E_BIN when set. Everything a run owns lives in
# ${HARNESS_E2E_RUN:-<repo>/target/e2e}: certs, data, logs, pid files and
#   kubeconfig     admin (system:masters) credentials
#   mongodb-uri    mongodb://127.0.0.1:<port>/
#   env            shell exports: KUBECONFIG, HARNESS_E2E_MONGODB_URI,
#                  HARNESS_E2E_BIN and every port
# All listeners bind 127.0.0.1 on ports picked free at start.
#
# Idempotent: a healthy control plane from this run dir is left alone; a
# partial or stale one is torn down (down.sh) and started fresh. On failure the
# failing component's log tail goes to stderr, down.sh runs, and the exit code
# is non-zero. Per-component timeout: HARNESS_E2E_TIMEOUT seconds (default 60).
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

umask 077 # keys, credentials and data are for this user only
timeout_s=${HARNESS_E2E_TIMEOUT:-60}
service_cidr=10.0.0.0/24
sa_issuer=https://kubernetes.default.svc.cluster.local
components=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok agent-sandbox-controller ferretdb)

now() { printf '%s' "${EPOCHREALTIME/[,.]/}"; } # microseconds
secs() { awk -v us="$1" 'BEGIN { printf "%.1f", us / 1e6 }'; }
t_total=$(now)

# HARNESS_E2E_BIN may point at an already built bin dir; otherwise build (a
# no-op once cached).
BIN=${HARNESS_E2E_BIN:-$(bash "$E2E_DIR/scripts/build.sh")}
KUBECTL=$BIN/kubectl
CERTS=$RUN/certs

# --- already up? ------------------------------------------------------------

apiserver_ready() { # uses the admin client cert; works before kubeconfig exists
  curl -fsS --max-time 2 --cacert "$CERTS/ca.crt" --cert "$CERTS/admin.crt" \
    --key "$CERTS/admin.key" "https://127.0.0.1:$1/readyz" >/dev/null 2>&1
}

all_running() {
  local c
  for c in "${components[@]}"; do
    [[ -f $RUN/pids/$c.pid ]] || return 1
    pid_owned "$(<"$RUN/pids/$c.pid")" || return 1
  done
}

if [[ -f $RUN/env ]] && all_running; then
  api_port=$(sed -n 's/^export HARNESS_E2E_APISERVER_PORT=//p' "$RUN/env")
  if [[ -n $api_port ]] && apiserver_ready "$api_port"; then
    log "up: control plane in $RUN is already up and healthy"
    echo "kubeconfig:  $RUN/kubeconfig"
    echo "mongodb-uri: $(<"$RUN/mongodb-uri")"
    echo "env:         source $RUN/env"
    echo "total: $(secs $(($(now) - t_total)))s (no-op)"
    exit 0
  fi
fi
if [[ -d $RUN/pids ]] || [[ -n $(stray_pids) ]]; then
  log "up: found a stale or partial control plane in $RUN; tearing it down"
  bash "$E2E_DIR/scripts/down.sh"
fi

# --- failure handling -----------------------------------------------------------

step=setup
up_done=false
on_exit() {
  local rc=$?
  if [[ $rc -ne 0 ]] && ! $up_done; then
    log "up: FAILED at step '$step' (exit $rc)"
    bash "$E2E_DIR/scripts/down.sh" || true
  fi
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# fail COMPONENT MESSAGE: report, show the log tail, and exit (down.sh via trap).
fail() {
  local name=$1 msg=$2 logf=$RUN/logs/$1.log
  log "up: $name FAILED: $msg"
  if [[ -s $logf ]]; then
    log "---- last 40 lines of $logf ----"
    tail -n 40 "$logf" >&2
    log "----"
  else
    log "($logf is empty)"
  fi
  exit 1
}

# --- helpers ----------------------------------------------------------------

# free_ports N: N distinct ports that were free on 127.0.0.1 a moment ago.
free_ports() {
  python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# start NAME CMD...: run CMD in its own session, output to logs/NAME.log. The
# wrapper writes its own pid (which CMD then inherits through exec).
start() {
  local name=$1 pidf=$RUN/pids/$1.pid i
  shift
  step=$name
  rm -f "$pidf"
  # shellcheck disable=SC2016 # expanded by the inner shell
  setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' "$name" "$pidf" "$@" \
    </dev/null >>"$RUN/logs/$name.log" 2>&1 &
  for ((i = 0; i < 100; i++)); do
    [[ -s $pidf ]] && return 0
    sleep 0.05
  done
  fail "$name" "process did not start"
}

# wait_healthy NAME CHECK...: poll CHECK until it succeeds, the process dies,
# or the timeout passes.
wait_healthy() {
  local name=$1 pidf=$RUN/pids/$1.pid deadline=$((SECONDS + timeout_s))
  shift
  until "$@" >/dev/null 2>&1; do
    if [[ -f $pidf ]] && ! pid_alive "$(<"$pidf")"; then
      fail "$name" "process exited before becoming healthy"
    fi
    ((SECONDS < deadline)) || fail "$name" "not healthy after ${timeout_s}s (check: $*)"
    sleep 0.2
  done
}

timings=()
t_step=$(now)
mark() { # record how long the step since the previous mark took
  local t
  t=$(now)
  timings+=("$(printf '%-26s %6ss' "$1" "$(secs $((t - t_step)))")")
  t_step=$t
}

https_ok() { curl -fsSk --max-time 2 "https://127.0.0.1:$1$2"; }
http_ok() { curl -fsS --max-time 2 "http://127.0.0.1:$1$2"; }
kc() { "$KUBECTL" --kubeconfig "$RUN/kubeconfig" "$@"; }

# --- layout and ports ---------------------------------------------------------

rm -rf "$RUN/pids" "$RUN/etcd" "$RUN/ferretdb" "$RUN/kwok" "$RUN/tmp" "$CERTS"
mkdir -p "$RUN/logs" "$RUN/pids" "$RUN/etcd" "$RUN/ferretdb" "$RUN/kwok" "$RUN/tmp" "$CERTS"
chmod 700 "$RUN/etcd" "$CERTS"
# Fresh logs per start; the previous run's are kept once as *.log.prev.
for f in "$RUN"/logs/*.log; do
  [[ -f $f ]] && mv -f "$f" "$f.prev"
done

read -r etcd_port etcd_peer_port api_port kcm_port sched_port kwok_port \
  sandbox_metrics_port sandbox_probe_port mongo_port ferret_debug_port \
  < <(free_ports 10)

# --- certificates -------------------------------------------------------------

step=certificates
(
  cd "$CERTS"
  exec 2>>"$RUN/logs/certificates.log"
  openssl ecparam -name prime256v1 -genkey -noout -out ca.key
  openssl req -x509 -new -key ca.key -sha256 -days 30 -subj "/CN=harness-e2e-ca" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" -out ca.crt

  # issue NAME SUBJECT EXTENSIONS: an EC key and a CA-signed certificate.
  issue() {
    openssl ecparam -name prime256v1 -genkey -noout -out "$1.key"
    openssl req -new -key "$1.key" -subj "$2" -out "$1.csr"
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
      -sha256 -days 30 -extfile <(printf '%s\n' "$3") -out "$1.crt"
    rm -f "$1.csr"
  }
  client="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
  issue apiserver "/CN=kube-apiserver" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  issue admin "/O=system:masters/CN=harness-e2e-admin" "$client"
  issue kube-controller-manager "/CN=system:kube-controller-manager" "$client"
  issue kube-scheduler "/CN=system:kube-scheduler" "$client"
  # For the aggregation layer; also gives kcm/scheduler a request-header CA.
  issue front-proxy-client "/CN=front-proxy-client" "$client"

  # ServiceAccount token signing pair.
  openssl genpkey -quiet -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key
  openssl pkey -in sa.key -pubout -out sa.pub
) || fail certificates "openssl failed"

b64() { base64 -w0 <"$1"; }
# kubeconfig FILE USER: a kubeconfig for USER's client certificate.
kubeconfig() {
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: harness-e2e
  cluster:
    server: https://127.0.0.1:$api_port
    certificate-authority-data: $(b64 "$CERTS/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(b64 "$CERTS/$2.crt")
    client-key-data: $(b64 "$CERTS/$2.key")
contexts:
- name: harness-e2e
  context:
    cluster: harness-e2e
    user: $2
current-context: harness-e2e
EOF
}
kubeconfig "$CERTS/kube-controller-manager.kubeconfig" kube-controller-manager
kubeconfig "$CERTS/kube-scheduler.kubeconfig" kube-scheduler
kubeconfig "$RUN/kubeconfig" admin
mark certificates

# --- etcd -----------------------------------------------------------------------

start etcd "$BIN/etcd" \
  --name=e2e \
  --data-dir="$RUN/etcd" \
  --listen-client-urls="http://127.0.0.1:$etcd_port" \
  --advertise-client-urls="http://127.0.0.1:$etcd_port" \
  --listen-peer-urls="http://127.0.0.1:$etcd_peer_port" \
  --initial-advertise-peer-urls="http://127.0.0.1:$etcd_peer_port" \
  --initial-cluster="e2e=http://127.0.0.1:$etcd_peer_port" \
  --initial-cluster-state=new \
  --unsafe-no-fsync \
  --log-level=warn
etcd_healthy() { http_ok "$etcd_port" /health | grep -q '"health":"true"'; }
wait_healthy etcd etcd_healthy
mark etcd

# --- kube-apiserver ---------------------------------------------------------------
# A loopback advertise address cannot back the `kubernetes` Service endpoints,
# so the endpoint reconciler is off (no pod here talks to the apiserver).

start kube-apiserver "$BIN/kube-apiserver" \
  --etcd-servers="http://127.0.0.1:$etcd_port" \
  --bind-address=127.0.0.1 \
  --advertise-address=127.0.0.1 \
  --endpoint-reconciler-type=none \
  --secure-port="$api_port" \
  --cert-dir="$RUN/tmp/kube-apiserver" \
  --tls-cert-file="$CERTS/apiserver.crt" \
  --tls-private-key-file="$CERTS/apiserver.key" \
  --client-ca-file="$CERTS/ca.crt" \
  --requestheader-client-ca-file="$CERTS/ca.crt" \
  --requestheader-allowed-names=front-proxy-client \
  --requestheader-username-headers=X-Remote-User \
  --requestheader-group-headers=X-Remote-Group \
  --requestheader-extra-headers-prefix=X-Remote-Extra- \
  --proxy-client-cert-file="$CERTS/front-proxy-client.crt" \
  --proxy-client-key-file="$CERTS/front-proxy-client.key" \
  --authorization-mode=Node,RBAC \
  --service-account-issuer="$sa_issuer" \
  --service-account-key-file="$CERTS/sa.pub" \
  --service-account-signing-key-file="$CERTS/sa.key" \
  --api-audiences="$sa_issuer,harness-engine" \
  --service-cluster-ip-range="$service_cidr" \
  --allow-privileged=true \
  --profiling=false
wait_healthy kube-apiserver apiserver_ready "$api_port"
mark kube-apiserver

# --- kube-controller-manager ------------------------------------------------------

kcm_kc=$CERTS/kube-controller-manager.kubeconfig
start kube-controller-manager "$BIN/kube-controller-manager" \
  --kubeconfig="$kcm_kc" \
  --authentication-kubeconfig="$kcm_kc" \
  --authorization-kubeconfig="$kcm_kc" \
  --leader-elect=false \
  --bind-address=127.0.0.1 \
  --secure-port="$kcm_port" \
  --cert-dir="$RUN/tmp/kube-controller-manager" \
  --root-ca-file="$CERTS/ca.crt" \
  --service-account-private-key-file="$CERTS/sa.key" \
  --use-service-account-credentials=true \
  --cluster-signing-cert-file="$CERTS/ca.crt" \
  --cluster-signing-key-file="$CERTS/ca.key" \
  --service-cluster-ip-range="$service_cidr" \
  --profiling=false
wait_healthy kube-controller-manager https_ok "$kcm_port" /healthz
mark kube-controller-manager

# --- kube-scheduler ---------------------------------------------------------------

sched_kc=$CERTS/kube-scheduler.kubeconfig
start kube-scheduler "$BIN/kube-scheduler" \
  --kubeconfig="$sched_kc" \
  --authentication-kubeconfig="$sched_kc" \
  --authorization-kubeconfig="$sched_kc" \
  --leader-elect=false \
  --bind-address=127.0.0.1 \
  --secure-port="$sched_port" \
  --cert-dir="$RUN/tmp/kube-scheduler" \
  --profiling=false
wait_healthy kube-scheduler https_ok "$sched_port" /healthz
mark kube-scheduler

# --- kwok and the fake nodes --------------------------------------------------------

step=kwok-nodes
kc create -f "$E2E_DIR/kwok/nodes.yaml" >>"$RUN/logs/kwok.log" 2>&1 ||
  fail kwok "could not create the nodes from e2e/kwok/nodes.yaml"
# KWOK_WORKDIR keeps kwok away from ~/.kwok (it would load ~/.kwok/kwok.yaml).
start kwok env KWOK_WORKDIR="$RUN/kwok" "$BIN/kwok" \
  --kubeconfig="$RUN/kubeconfig" \
  --config="$E2E_DIR/kwok/kwok.yaml" \
  --config="$E2E_DIR/kwok/stages.yaml" \
  --server-address="127.0.0.1:$kwok_port"
wait_healthy kwok http_ok "$kwok_port" /healthz
mark kwok

# --- Agent Sandbox --------------------------------------------------------------------

step=agent-sandbox-crds
kc apply --server-side --force-conflicts -f "$BIN/agent-sandbox-crds/" \
  >>"$RUN/logs/agent-sandbox-controller.log" 2>&1 ||
  fail agent-sandbox-controller "applying the CRDs failed"
kc wait --for=condition=Established --timeout="${timeout_s}s" \
  -f "$BIN/agent-sandbox-crds/" >>"$RUN/logs/agent-sandbox-controller.log" 2>&1 ||
  fail agent-sandbox-controller "CRDs not Established"
start agent-sandbox-controller env KUBECONFIG="$RUN/kubeconfig" "$BIN/agent-sandbox-controller" \
  --kubeconfig="$RUN/kubeconfig" \
  --extensions \
  --leader-elect=false \
  --metrics-bind-address="127.0.0.1:$sandbox_metrics_port" \
  --health-probe-bind-address="127.0.0.1:$sandbox_probe_port"
wait_healthy agent-sandbox-controller http_ok "$sandbox_probe_port" /readyz
mark agent-sandbox-controller

# --- FerretDB -----------------------------------------------------------------------

start ferretdb "$BIN/ferretdb" \
  --handler=sqlite \
  --sqlite-url="file:$RUN/ferretdb/" \
  --state-dir="$RUN/ferretdb" \
  --listen-addr="127.0.0.1:$mongo_port" \
  --debug-addr="127.0.0.1:$ferret_debug_port" \
  --telemetry=disable \
  --log-level=warn
ferret_ready() {
  http_ok "$ferret_debug_port" /debug/readyz &&
    python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 2).close()' "$mongo_port"
}
wait_healthy ferretdb ferret_ready
mark ferretdb

# --- cluster-level readiness ------------------------------------------------------------

default_sa() { kc -n default get serviceaccount default; }
step=default-serviceaccount
wait_healthy kube-controller-manager default_sa
mark "default ServiceAccount"

nodes_ready() {
  local n
  n=$(kc get nodes -l type=kwok \
    -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' |
    grep -c '^True$')
  [[ $n -eq 3 ]]
}
step=nodes-ready
wait_healthy kwok nodes_ready
mark "kwok nodes Ready"

# --- outputs ----------------------------------------------------------------------

mongo_uri="mongodb://127.0.0.1:$mongo_port/"
echo "$mongo_uri" >"$RUN/mongodb-uri"
{
  for kv in \
    "KUBECONFIG=$RUN/kubeconfig" \
    "HARNESS_E2E_MONGODB_URI=$mongo_uri" \
    "HARNESS_E2E_BIN=$BIN" \
    "HARNESS_E2E_RUN=$RUN" \
    "HARNESS_E2E_ETCD_PORT=$etcd_port" \
    "HARNESS_E2E_ETCD_PEER_PORT=$etcd_peer_port" \
    "HARNESS_E2E_APISERVER_PORT=$api_port" \
    "HARNESS_E2E_KCM_PORT=$kcm_port" \
    "HARNESS_E2E_SCHEDULER_PORT=$sched_port" \
    "HARNESS_E2E_KWOK_PORT=$kwok_port" \
    "HARNESS_E2E_SANDBOX_METRICS_PORT=$sandbox_metrics_port" \
    "HARNESS_E2E_SANDBOX_PROBE_PORT=$sandbox_probe_port" \
    "HARNESS_E2E_MONGODB_PORT=$mongo_port" \
    "HARNESS_E2E_FERRETDB_DEBUG_PORT=$ferret_debug_port"; do
    printf 'export %s=%q\n' "${kv%%=*}" "${kv#*=}"
  done
} >"$RUN/env"
up_done=true

echo "control plane up in $RUN"
printf '  %s\n' "${timings[@]}"
echo "kubeconfig:  $RUN/kubeconfig"
echo "mongodb-uri: $mongo_uri"
echo "env:         source $RUN/env"
echo "total: $(secs $(($(now) - t_total)))s"
