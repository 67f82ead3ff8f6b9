#!/usr/bin/env bash
# The real-node tier: a control plane plus ONE real node (containerd + runc from Debian's
# packages, kubelet and kube-proxy built from e2e/go.mod's Kubernetes, a CNI bridge) with
# the Agent Sandbox controller, and our images (pause, operator, example worker) built
# with buildah and imported into containerd: no registry, no Docker.
#
#   e2e/scripts/realnode.sh up      start (idempotent: a healthy node of this run is kept)
#   e2e/scripts/realnode.sh down    stop pods and processes; remove mounts, netns, the
#                                   bridge, KUBE-*/CNI-* iptables chains and kubepods cgroups
#   e2e/scripts/realnode.sh check   exit 0 when containerd and runc can run here
#
# One real node per machine (kubelet cgroups, iptables and hard-coded paths are
# host-wide): `up` takes the lock /run/lock/harness-engine-real-node (a directory naming
# its run dir) and `down` releases it. Run dir: ${HARNESS_E2E_RUN:-<repo>/target/e2e-node};
# `source $RUN/env` gives KUBECONFIG, HARNESS_E2E_BIN, HARNESS_E2E_NODE_BIN,
# HARNESS_E2E_IMAGES and the node name. The three VM settings this needs and why are in
# /work/shared/notes/real-node.md: restrict_oom_score_adj, failCgroupV1: false,
# --kubelet-preferred-address-types=InternalIP,Hostname.
#
# Env: HARNESS_ENGINE_BIN (the operator binary for the image; default target/debug),
#      HARNESS_E2E_TIMEOUT (seconds per component, default 60).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export HARNESS_E2E_RUN=${HARNESS_E2E_RUN:-$(cd "$here/../.." && pwd)/target/e2e-node}
# shellcheck source=lib.sh
source "$here/lib.sh"
# shellcheck source=node-lib.sh
source "$here/node-lib.sh" # tag_by_digest (ctr_ is redefined below for $SOCK)

LOCK=${HARNESS_E2E_NODE_LOCK:-/run/lock/harness-engine-real-node}
NODE=harness-real-node
ETCD_PORT=22379 ETCD_PEER=22380 API_PORT=26443 KCM_PORT=20257 SCHED_PORT=20259
KUBELET_PORT=20250 KUBELET_HEALTHZ=20248 PROXY_HEALTHZ=20256 PROXY_METRICS=20249
SANDBOX_METRICS=20281 SANDBOX_PROBE=20282
POD_CIDR=10.88.0.0/24 SVC_CIDR=10.0.0.0/24 BRIDGE=hebr0
SOCK=$RUN/containerd/containerd.sock
C=$RUN/certs
timeout_s=${HARNESS_E2E_TIMEOUT:-60}
now() { date +%s.%N; }
T0=$(now); TS=$T0
mark() { local t; t=$(now); printf '  %-28s %6.2fs\n' "$1" "$(echo "$t - $TS" | bc)" >&2; TS=$t; }
ctr_() { ctr -a "$SOCK" -n k8s.io "$@"; }

check() { # containerd and runc present (installed when missing) and runc can create a container
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  [[ -x /usr/lib/cni/bridge ]] || missing+=(containernetworking-plugins)
  command -v buildah >/dev/null || missing+=(buildah)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v bc >/dev/null || missing+=(bc)
  if ((${#missing[@]})); then
    log "realnode: installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2 ||
      { apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2; } ||
      { log "realnode: cannot install ${missing[*]}"; return 1; }
  fi
  [[ $(id -u) == 0 ]] || { log "realnode: needs root (kubelet, containerd, iptables)"; return 1; }
  [[ -d /sys/fs/cgroup/memory || -f /sys/fs/cgroup/cgroup.controllers ]] || { log "realnode: no cgroups"; return 1; }
  return 0
}

start() { # name cmd...: own session, log, pid file (the command line names $RUN)
  local n=$1; shift
  setsid "$@" </dev/null >>"$RUN/logs/$n.log" 2>&1 &
  echo $! >"$RUN/pids/$n.pid"
}
waitfor() { # name check...
  local n=$1 deadline=$((SECONDS + timeout_s)); shift
  until "$@" >/dev/null 2>&1; do
    pid_alive "$(cat "$RUN/pids/$n.pid" 2>/dev/null)" || { log "realnode: $n died"; tail -30 "$RUN/logs/$n.log" >&2; return 1; }
    ((SECONDS < deadline)) || { log "realnode: $n not healthy after ${timeout_s}s"; tail -30 "$RUN/logs/$n.log" >&2; return 1; }
    sleep 0.1
  done
}

lock() {
  mkdir -p "$(dirname "$LOCK")"
  if mkdir "$LOCK" 2>/dev/null; then echo "$RUN" >"$LOCK/run"; return 0; fi
  local holder; holder=$(cat "$LOCK/run" 2>/dev/null || true)
  [[ $holder == "$RUN" ]] && return 0
  if [[ -n $holder && -f $holder/pids/kube-apiserver.pid ]] && pid_alive "$(cat "$holder/pids/kube-apiserver.pid")"; then
    log "realnode: the real node of $holder holds $LOCK (one per machine); run its down first"
    return 1
  fi
  log "realnode: taking over a stale lock from $holder"
  echo "$RUN" >"$LOCK/run"
}
unlock() { [[ $(cat "$LOCK/run" 2>/dev/null) == "$RUN" ]] && rm -rf "$LOCK"; return 0; }

certs() {
  mkdir -p "$C"; chmod 700 "$C"
  (cd "$C"
  openssl ecparam -name prime256v1 -genkey -noout -out ca.key
  openssl req -x509 -new -key ca.key -sha256 -days 30 -subj "/CN=harness-real-node-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" -out ca.crt
  issue() { openssl ecparam -name prime256v1 -genkey -noout -out "$1.key"
    openssl req -new -key "$1.key" -subj "$2" -out "$1.csr"
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -sha256 -days 30 \
      -extfile <(printf '%s\n' "$3") -out "$1.crt"; rm -f "$1.csr"; }
  local client=$'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth'
  issue apiserver "/CN=kube-apiserver" $'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n'"subjectAltName=IP:127.0.0.1,IP:10.0.0.1,IP:$NODE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  issue admin "/O=system:masters/CN=harness-e2e-admin" "$client"
  issue kube-controller-manager "/CN=system:kube-controller-manager" "$client"
  issue kube-scheduler "/CN=system:kube-scheduler" "$client"
  issue kube-proxy "/CN=system:kube-proxy" "$client"
  issue front-proxy-client "/CN=front-proxy-client" "$client"
  issue kubelet "/O=system:nodes/CN=system:node:$NODE" "$client"
  issue apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client"
  openssl genpkey -quiet -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key
  openssl pkey -in sa.key -pubout -out sa.pub
  local u; for u in admin kube-controller-manager kube-scheduler kube-proxy kubelet; do cat >"$u.kubeconfig" <<EOK
apiVersion: v1
kind: Config
clusters: [{name: real-node, cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority-data: $(base64 -w0 ca.crt)}}]
users: [{name: $u, user: {client-certificate-data: $(base64 -w0 "$u.crt"), client-key-data: $(base64 -w0 "$u.key")}}]
contexts: [{name: real-node, context: {cluster: real-node, user: $u}}]
current-context: real-node
EOK
  done
  cp admin.kubeconfig "$RUN/kubeconfig") 2>>"$RUN/logs/certificates.log"
}

control_plane() {
  start etcd "$BIN/etcd" --name=real-node --data-dir="$RUN/etcd" \
    --listen-client-urls=http://127.0.0.1:$ETCD_PORT --advertise-client-urls=http://127.0.0.1:$ETCD_PORT \
    --listen-peer-urls=http://127.0.0.1:$ETCD_PEER --initial-advertise-peer-urls=http://127.0.0.1:$ETCD_PEER \
    --initial-cluster=real-node=http://127.0.0.1:$ETCD_PEER --initial-cluster-state=new --unsafe-no-fsync \
    --listen-metrics-urls=http://127.0.0.1:22381 --log-level=warn
  waitfor etcd sh -c "curl -fsS http://127.0.0.1:$ETCD_PORT/health | grep -q true"; mark etcd
  # 0.0.0.0 and a non-loopback advertise address: pods reach it through the kubernetes Service.
  start kube-apiserver "$BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:$ETCD_PORT \
    --bind-address=0.0.0.0 --advertise-address="$NODE_IP" --secure-port=$API_PORT \
    --cert-dir="$RUN/tmp/apiserver" --tls-cert-file=$C/apiserver.crt --tls-private-key-file=$C/apiserver.key \
    --client-ca-file=$C/ca.crt --requestheader-client-ca-file=$C/ca.crt --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- --proxy-client-cert-file=$C/front-proxy-client.crt \
    --proxy-client-key-file=$C/front-proxy-client.key \
    --kubelet-client-certificate=$C/apiserver-kubelet-client.crt --kubelet-client-key=$C/apiserver-kubelet-client.key \
    --kubelet-preferred-address-types=InternalIP,Hostname \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local --service-account-key-file=$C/sa.pub \
    --service-account-signing-key-file=$C/sa.key \
    --api-audiences=https://kubernetes.default.svc.cluster.local,harness-engine \
    --service-cluster-ip-range=$SVC_CIDR --allow-privileged=true --profiling=false
  waitfor kube-apiserver curl -fsS --cacert $C/ca.crt --cert $C/admin.crt --key $C/admin.key https://127.0.0.1:$API_PORT/readyz
  mark kube-apiserver
  local kc=$C/kube-controller-manager.kubeconfig
  start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig=$kc \
    --authentication-kubeconfig=$kc --authorization-kubeconfig=$kc --leader-elect=false \
    --bind-address=127.0.0.1 --secure-port=$KCM_PORT --cert-dir="$RUN/tmp/kcm" \
    --root-ca-file=$C/ca.crt --service-account-private-key-file=$C/sa.key --use-service-account-credentials=true \
    --cluster-signing-cert-file=$C/ca.crt --cluster-signing-key-file=$C/ca.key --service-cluster-ip-range=$SVC_CIDR \
    --profiling=false
  waitfor kube-controller-manager curl -fsSk https://127.0.0.1:$KCM_PORT/healthz; mark kube-controller-manager
  kc=$C/kube-scheduler.kubeconfig
  start kube-scheduler "$BIN/kube-scheduler" --kubeconfig=$kc --authentication-kubeconfig=$kc \
    --authorization-kubeconfig=$kc --leader-elect=false --bind-address=127.0.0.1 --secure-port=$SCHED_PORT \
    --cert-dir="$RUN/tmp/sched" --profiling=false
  waitfor kube-scheduler curl -fsSk https://127.0.0.1:$SCHED_PORT/healthz; mark kube-scheduler
}

containerd_up() {
  mkdir -p "$RUN/containerd" "$RUN/cni/net.d"
  cat >"$RUN/containerd/config.toml" <<EOC
version = 2
root = "$RUN/containerd/root"
state = "$RUN/containerd/state"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "$SOCK"
[ttrpc]
  address = ""
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/harness-engine/pause:$IMAGE_TAG"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  # The VM withholds CAP_SYS_RESOURCE: a negative oom_score_adj fails inside runc
  # ("can't get final child's PID from pipe: EOF"); this clamps it to containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "$(command -v runc)"
        Root = "$RUN/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$RUN/cni/net.d"
EOC
  cat >"$RUN/cni/net.d/10-harness.conflist" <<EOC
{"cniVersion": "0.4.0", "name": "harness-real-node", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": true, "hairpinMode": true, "mtu": 1400,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": "$RUN/cni/ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}},
  {"type": "loopback"}]}
EOC
  start containerd containerd --config "$RUN/containerd/config.toml"
  waitfor containerd ctr_ version; mark containerd
  local i; for i in "$IMAGES"/*.tar; do ctr_ images import "$i" >/dev/null; done
  tag_by_digest # e2e/scripts/node-lib.sh
  mark "import images"
}

kubelet_up() {
  mkdir -p "$RUN/kubelet/root" "$RUN/kubelet/pki" "$RUN/kubelet/pod-logs" "$RUN/kubelet/volume-plugins"
  cat >"$RUN/kubelet/config.yaml" <<EOC
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ
cgroupDriver: cgroupfs        # containerd 1.6 has no RuntimeConfig RPC
cgroupRoot: /
failCgroupV1: false           # defaults to true in 1.37; this VM is cgroup v1 (hybrid)
failSwapOn: false
containerRuntimeEndpoint: unix://$SOCK
imageServiceEndpoint: unix://$SOCK
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $C/ca.crt}
authorization: {mode: Webhook}
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
maxPods: 110
rotateCertificates: false
serverTLSBootstrap: false
imageGCHighThresholdPercent: 100   # never GC the imported images (imagePullPolicy Never)
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
volumePluginDir: $RUN/kubelet/volume-plugins
podLogsDir: $RUN/kubelet/pod-logs
shutdownGracePeriod: 0s
EOC
  start kubelet "$NODE_BIN/kubelet" --config="$RUN/kubelet/config.yaml" --kubeconfig=$C/kubelet.kubeconfig \
    --root-dir="$RUN/kubelet/root" --cert-dir="$RUN/kubelet/pki" --hostname-override=$NODE \
    --node-ip="$NODE_IP" --node-labels=type=real --v=1
  node_ready() { [[ $(kc get node $NODE -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') == True ]]; }
  waitfor kubelet node_ready; mark "kubelet -> node Ready"
}

proxy_up() {
  cat >"$RUN/kube-proxy.yaml" <<EOC
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $C/kube-proxy.kubeconfig}
hostnameOverride: $NODE
mode: iptables
clusterCIDR: $POD_CIDR
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:$PROXY_HEALTHZ
metricsBindAddress: 127.0.0.1:$PROXY_METRICS
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
nodePortAddresses: ["$NODE_IP/32"]
EOC
  start kube-proxy "$NODE_BIN/kube-proxy" --config="$RUN/kube-proxy.yaml"
  waitfor kube-proxy curl -fsS http://127.0.0.1:$PROXY_HEALTHZ/healthz; mark kube-proxy
}

sandbox_up() {
  kc apply --server-side --force-conflicts -f "$BIN/agent-sandbox-crds/" >>"$RUN/logs/agent-sandbox-controller.log" 2>&1
  kc wait --for=condition=Established --timeout=60s -f "$BIN/agent-sandbox-crds/" >>"$RUN/logs/agent-sandbox-controller.log" 2>&1
  start agent-sandbox-controller env KUBECONFIG="$RUN/kubeconfig" "$BIN/agent-sandbox-controller" \
    --kubeconfig="$RUN/kubeconfig" --extensions --leader-elect=false \
    --metrics-bind-address="127.0.0.1:$SANDBOX_METRICS" --health-probe-bind-address="127.0.0.1:$SANDBOX_PROBE"
  waitfor agent-sandbox-controller curl -fsS http://127.0.0.1:$SANDBOX_PROBE/readyz; mark agent-sandbox-controller
}

kc() { "$BIN/kubectl" --kubeconfig "$RUN/kubeconfig" "$@"; }

up() {
  check || exit 1
  NODE_IP=${NODE_IP:-$(ip -4 -o route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')}
  [[ -n $NODE_IP ]] || { log "realnode: no node IP (no default route)"; exit 1; }
  if [[ -f $RUN/env && -f $RUN/pids/kubelet.pid ]] && pid_alive "$(cat "$RUN/pids/kubelet.pid")" &&
    curl -fsS --max-time 2 http://127.0.0.1:$KUBELET_HEALTHZ/healthz >/dev/null 2>&1; then
    log "realnode: $RUN is already up"; exit 0
  fi
  lock || exit 1
  [[ -d $RUN/pids ]] && down
  lock || exit 1
  trap 'rc=$?; ((rc)) && { log "realnode: up failed; cleaning up"; down; }; exit $rc' EXIT
  BIN=${HARNESS_E2E_BIN:-$("$here/build.sh")}
  NODE_BIN=$("$here/build-node.sh"); mark "kubelet, kube-proxy built"
  local operator=${HARNESS_ENGINE_BIN:-$REPO_DIR/target/debug/harness-engine}
  [[ -x $operator ]] || { log "realnode: no operator binary at $operator (cargo build first)"; exit 1; }
  IMAGES=$RUN/images; IMAGE_TAG=$("$REPO_DIR/e2e/images/build.sh" tag)
  mkdir -p "$RUN/logs" "$RUN/pids" "$RUN/etcd" "$RUN/tmp" "$IMAGES"
  local bases; bases=$("$REPO_DIR/e2e/images/build.sh" bases)
  cp "$bases/pause.tar" "$IMAGES/"
  TAG=dev "$REPO_DIR/e2e/images/build.sh" operator "$IMAGES" "$operator"
  TAG=dev "$REPO_DIR/e2e/images/build.sh" worker "$IMAGES"
  mark "images"
  certs; mark certificates
  control_plane
  containerd_up
  kubelet_up
  proxy_up
  sandbox_up
  waitfor kube-controller-manager kc -n default get serviceaccount default; mark "default ServiceAccount"
  {
    printf 'export KUBECONFIG=%q\n' "$RUN/kubeconfig"
    printf 'export HARNESS_E2E_BIN=%q\n' "$BIN"
    printf 'export HARNESS_E2E_NODE_BIN=%q\n' "$NODE_BIN"
    printf 'export HARNESS_E2E_RUN=%q\n' "$RUN"
    printf 'export HARNESS_E2E_IMAGES=%q\n' "$IMAGES"
    printf 'export HARNESS_E2E_NODE=%q\n' "$NODE"
    printf 'export HARNESS_E2E_NODE_IP=%q\n' "$NODE_IP"
    printf 'export HARNESS_E2E_OPERATOR_IMAGE=%q\n' "localhost/harness-engine/operator:dev"
    printf 'export HARNESS_E2E_WORKER_IMAGE=%q\n' "localhost/harness-engine/worker:dev"
  } >"$RUN/env"
  trap - EXIT
  printf '  %-28s %6.2fs\n' total "$(echo "$(now) - $T0" | bc)" >&2
  echo "real node up in $RUN: source $RUN/env"
}

down() {
  set +e +o pipefail   # best effort: keep going past every failure
  BIN=${BIN:-$(sed -n 's/^export HARNESS_E2E_BIN=//p' "$RUN/env" 2>/dev/null)}
  NODE_BIN=${NODE_BIN:-$(sed -n 's/^export HARNESS_E2E_NODE_BIN=//p' "$RUN/env" 2>/dev/null)}
  local n p
  for n in agent-sandbox-controller kube-scheduler kube-controller-manager; do
    [[ -f $RUN/pids/$n.pid ]] && stop_pids "$(cat "$RUN/pids/$n.pid")"
  done
  # Pods: deleted through the API while the kubelet runs, so it tears each sandbox down
  # (CNI DEL, netns, mounts) itself; then whatever is left, through containerd.
  if [[ -n $BIN && -f $RUN/kubeconfig ]] && [[ -f $RUN/pids/kubelet.pid ]] && pid_alive "$(cat "$RUN/pids/kubelet.pid")"; then
    kc delete pods --all -A --grace-period=1 --wait=false >/dev/null 2>&1
    for _ in $(seq 100); do
      [[ -z $(ctr_ tasks ls -q 2>/dev/null) ]] && break; sleep 0.2
    done
  fi
  for n in kube-proxy kubelet; do [[ -f $RUN/pids/$n.pid ]] && stop_pids "$(cat "$RUN/pids/$n.pid")"; done
  if [[ -S $SOCK ]]; then
    for t in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s KILL "$t" >/dev/null 2>&1; done
    sleep 0.5
    for t in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks delete -f "$t" >/dev/null 2>&1; done
    for t in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$t" >/dev/null 2>&1; done
  fi
  for n in containerd kube-apiserver etcd; do [[ -f $RUN/pids/$n.pid ]] && stop_pids "$(cat "$RUN/pids/$n.pid")"; done
  # Strays whose command line names the run dir (containerd shims among them).
  mapfile -t p < <(stray_pids); ((${#p[@]})) && stop_pids "${p[@]}"
  # Host state: mounts under $RUN, CNI netns, the bridge, iptables chains, cgroups.
  { findmnt -rn -o TARGET | grep "^$RUN/" | sort -r || true; } | while read -r m; do umount "$m" 2>/dev/null || umount -l "$m"; done
  for n in /run/netns/cni-*; do [[ -e $n ]] || continue
    ip netns pids "$(basename "$n")" 2>/dev/null | grep -q . || { umount "$n" 2>/dev/null; rm -f "$n"; }; done
  ip link del "$BRIDGE" 2>/dev/null
  [[ -n $NODE_BIN && -x $NODE_BIN/kube-proxy ]] && "$NODE_BIN/kube-proxy" --cleanup >/dev/null 2>&1
  local t
  for t in filter nat mangle; do
    iptables-save -t $t | grep -E '^-A .*-j (KUBE|CNI)-' | sed 's/^-A/-D/' | while read -r r; do eval "iptables -t $t $r" 2>/dev/null; done
    iptables-save -t $t | awk '/^:(KUBE|CNI)-/{print substr($1,2)}' | while read -r ch; do iptables -t $t -F "$ch" 2>/dev/null; done
    iptables-save -t $t | awk '/^:(KUBE|CNI)-/{print substr($1,2)}' | while read -r ch; do iptables -t $t -X "$ch" 2>/dev/null; done
  done
  local sub
  for sub in /sys/fs/cgroup/*/kubepods; do [[ -d $sub ]] && find "$sub" -depth -type d -exec rmdir {} \; 2>/dev/null; done
  rm -rf /var/lib/cni/results/harness-real-node-* 2>/dev/null
  find /var/log/containers -maxdepth 1 -type l -lname "$RUN/*" -delete 2>/dev/null
  rm -f /var/lib/kubelet/device-plugins/kubelet.sock
  rmdir /var/lib/kubelet/device-plugins /var/lib/kubelet /var/log/containers /run/containerd/s /run/containerd \
    /var/lib/cni/results /var/lib/cni 2>/dev/null
  rm -rf "$RUN/pids" "$RUN/etcd" "$RUN/containerd" "$RUN/kubelet" "$RUN/runc" "$RUN/cni" "$RUN/tmp" "$RUN/env"
  unlock
  printf 'real node down (%.1fs)\n' "$(echo "$(now) - $T0" | bc)" >&2
  return 0
}

case ${1:-} in
  up) up ;;
  down) down ;;
  check) check ;;
  *) echo "usage: $0 up|down|check" >&2; exit 2 ;;
esac
