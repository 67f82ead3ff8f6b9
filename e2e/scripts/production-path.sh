#!/usr/bin/env bash
# The production path on a node whose pods really run: the real node
# (e2e/scripts/realnode.sh up first; `source $RUN/env`) or a kind cluster
# (e2e/scripts/kind-e2e.sh, the same steps through e2e/scripts/node-lib.sh): the chart installed with the image built from ./Dockerfile, the operator
# running as a pod under the chart's ServiceAccount and RBAC only, the webhook reached by
# the API server through its Service, a binding leasing a real sandbox pod that runs the
# example worker (examples/worker) and commits its checkpoints with its projected token;
# the worker pod deleted and the replacement resuming from the durable head; helm upgrade
# to a changed image keeping the binding and its head; helm uninstall (after the bindings
# are deleted) leaving no claim, Sandbox or worker pod behind.
#
# Every check prints what it saw; the first failure prints the operator's log and exits 1.
set -euo pipefail
: "${KUBECONFIG:?source the real node env first (e2e/scripts/realnode.sh up)}"
repo=$(cd "$(dirname "$0")/../.." && pwd)
K() { "$HARNESS_E2E_BIN/kubectl" "$@"; }
# ctr_, node_sh, node_curl, NODE_SELECTOR: the real node by default, a kind node under
# `make kind-e2e` (e2e/scripts/node-lib.sh).
# shellcheck source=node-lib.sh
source "$repo/e2e/scripts/node-lib.sh"
HELM=$("$repo/e2e/scripts/build-tools.sh")/helm
home=$(mktemp -d); trap 'rm -rf "$home"' EXIT
export HELM_CACHE_HOME=$home/c HELM_CONFIG_HOME=$home/f HELM_DATA_HOME=$home/d
NS=harness-engine-system APP=team-a
T0=$(date +%s.%N)
say() { printf '[%6.1fs] %s\n' "$(echo "$(date +%s.%N) - $T0" | bc)" "$*"; }
fail() {
  echo "FAIL: $*" >&2
  K -n $NS logs deploy/harness-engine --tail=60 >&2 2>/dev/null || true
  K -n $APP get harnessbindings,sandboxclaims,sandboxes,pods -o wide >&2 2>/dev/null || true
  exit 1
}
until_ok() { # seconds what cmd...
  local secs=$1 deadline=$(($(date +%s) + $1)) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do (($(date +%s) < deadline)) || fail "$what (after ${secs}s)"; sleep 0.5; done
}

# What an earlier run left (it failed midway, or deleted its namespaces without waiting):
# bindings first, while their operator can still release them, then the release.
if "$HELM" status harness-engine -n $NS >/dev/null 2>&1 || K get namespace $APP >/dev/null 2>&1; then
  say "removing what an earlier run left"
  K -n $APP delete harnessbindings --all --timeout=90s >/dev/null 2>&1 || true
  K -n $APP delete sandboxwarmpools --all --timeout=60s >/dev/null 2>&1 || true
  "$HELM" uninstall harness-engine -n $NS --wait --timeout 120s >/dev/null 2>&1 || true
  K delete namespace $APP $NS --ignore-not-found --wait=false >/dev/null
fi
absent() { ! K get namespace "$1" >/dev/null 2>&1; }
until_ok 180 "namespace $APP of an earlier run still terminating" absent $APP
until_ok 180 "namespace $NS of an earlier run still terminating" absent $NS

# The embedded store's volume: a hostPath PersistentVolume pre-bound to the chart's claim
# (there is no provisioner on this node), writable by the image's 65532.
pv_dir=${HARNESS_E2E_PV_ROOT:-$HARNESS_E2E_RUN/pv}/harness-engine-data
node_sh "rm -rf '$pv_dir' && mkdir -p '$pv_dir' && chown 65532:65532 '$pv_dir'"
K delete pv harness-engine-data-e2e --ignore-not-found --timeout=60s >/dev/null
K apply -f - >/dev/null <<EOF2
apiVersion: v1
kind: PersistentVolume
metadata: {name: harness-engine-data-e2e}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Delete
  storageClassName: ""
  claimRef: {namespace: $NS, name: harness-engine-data}
  hostPath: {path: $pv_dir, type: Directory}
EOF2

# 1. helm install: the operator image built from ./Dockerfile (imported, never pulled).
say "helm install"
"$HELM" install harness-engine "$repo/charts/harness-engine" -n $NS --create-namespace \
  --set image.repository=localhost/harness-engine/operator --set image.tag=dev --set image.pullPolicy=Never \
  --set store.persistence.size=1Gi --set webhook.certificates.mode=operator \
  --wait --timeout 180s >/dev/null || fail "helm install"
sa=$(K -n $NS get deploy harness-engine -o jsonpath='{.spec.template.spec.serviceAccountName}')
[[ $sa == harness-engine ]] || fail "operator runs as $sa"
say "operator Ready as ServiceAccount $NS/$sa ($(K -n $NS get pods -l app.kubernetes.io/name=harness-engine -o jsonpath='{.items[0].status.containerStatuses[0].imageID}'))"
# The chart's ClusterRoles are the only grants: no cluster-admin binding names the SA.
roles=$(K get clusterrolebindings -o jsonpath="{range .items[?(@.subjects[0].name==\"$sa\")]}{.roleRef.name}{\"\\n\"}{end}" | sort | tr '\n' ' ')
[[ $roles == "harness-engine-operator harness-engine-webhook-ca-bundle " ]] ||
  fail "the operator's ServiceAccount is bound to: $roles (want the chart's two ClusterRoles)"
# webhook.certificates.mode=operator: the leader made the CA and serving certificate
# and wrote the CA into every webhook of the configuration.
until_ok 60 "no managed webhook certificate Secret" K -n $NS get secret harness-engine-webhook-managed
ca=$(K -n $NS get secret harness-engine-webhook-managed -o jsonpath='{.data.ca\.crt}' | base64 -d)
bundles=$(K get validatingwebhookconfiguration harness-engine-validating-webhook -o jsonpath='{range .webhooks[*]}{.clientConfig.caBundle}{"\n"}{end}')
[[ $(echo "$bundles" | grep -c .) == 4 ]] || fail "caBundle missing on some webhook: $bundles"
while read -r b; do [[ $(echo "$b" | base64 -d) == "$ca" ]] || fail "a caBundle differs from the managed CA"; done <<<"$bundles"
say "webhook certificates made by the operator (Secret harness-engine-webhook-managed, caBundle on 4 webhooks)"

# 2. The data plane Service (no cluster DNS on this node: workers get the ClusterIP).
# The worker image is pinned by its manifest digest, as a SandboxProfile requires
# (realnode.sh imports every image under name@digest too, as a registry pull would).
digest=$(ctr_ images ls | awk '$1 == "localhost/harness-engine/worker:dev" {print $3}')
[[ $digest == sha256:* ]] || fail "worker image not imported (ctr images ls)"
api=$(K -n $NS get svc harness-engine -o jsonpath='{.spec.clusterIP}')
K create namespace $APP >/dev/null
K -n $APP apply -f - >/dev/null <<EOF2
apiVersion: v1
kind: ServiceAccount
metadata: {name: harness-worker}
automountServiceAccountToken: false
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata: {name: python-worker}
spec:
  podTemplate:
    metadata:
      labels: {app.kubernetes.io/name: harness-worker}
      annotations: {harness-engine.dev/worker-protocol-version: "1"}
    spec:
      serviceAccountName: harness-worker
      automountServiceAccountToken: false
      nodeSelector: $NODE_SELECTOR
      containers:
      - name: worker
        image: localhost/harness-engine/worker@$digest
        imagePullPolicy: Never
        env:
        - {name: HARNESS_ENGINE_ENDPOINT, value: "http://$api:8080"}
        - {name: HARNESS_ENGINE_TOKEN_FILE, value: /var/run/secrets/harness-engine/token}
        readinessProbe: {httpGet: {path: /healthz, port: 8000}, periodSeconds: 1}
        resources: {requests: {cpu: 50m, memory: 64Mi}, limits: {memory: 256Mi}}
        volumeMounts: [{name: harness-engine-token, mountPath: /var/run/secrets/harness-engine, readOnly: true}]
      volumes:
      - name: harness-engine-token
        projected:
          sources: [{serviceAccountToken: {audience: harness-engine, expirationSeconds: 3600, path: token}}]
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxWarmPool
metadata: {name: python-worker}
spec: {replicas: 1, sandboxTemplateRef: {name: python-worker}}
EOF2
say "warm pool created; waiting for a warm worker pod"
until_ok 120 "no Ready warm worker pod" K -n $APP wait --for=condition=Ready pod -l app.kubernetes.io/name=harness-worker --timeout=2s
image_id=$(K -n $APP get pods -l app.kubernetes.io/name=harness-worker -o jsonpath='{.items[0].status.containerStatuses[0].imageID}')
[[ $image_id == *"@$digest" ]] || fail "the kubelet reports worker image $image_id, not $digest"
say "worker image $image_id"

# 3. The profile (its digest is the worker image's, as the kubelet reports it).
K -n $APP apply -f - >/dev/null <<EOF2 || fail "profile refused"
apiVersion: harness-engine.dev/v1alpha1
kind: SandboxProfile
metadata: {name: python-worker}
spec:
  warmPoolRef: {name: python-worker}
  allowedHarnessIds: [deepagents]
  allowedWorkerImageDigests: ["$digest"]
  adapterVersion: "1.0.0"
  workerProtocolVersions: [1]
  egressPolicyClass: data-plane-only
  timeouts: {claimReadinessDeadline: 2m, idleTTL: 6h, maxLifetime: 12h}
  hibernation: never
EOF2

# 4. The webhook through its Service: a binding naming a SandboxProfile that does not
# exist is refused by the operator's webhook (a reference to another object: a rule CEL
# cannot express, so only the webhook can answer it).
bad=$(K -n $APP apply -f - 2>&1 <<EOF2 || true
apiVersion: harness-engine.dev/v1alpha1
kind: HarnessBinding
metadata: {name: leaky}
spec:
  agentId: research-assistant
  conversationId: conv-leaky
  subjectRef: hmac-sha256:5f0c6c8f3f5b0e1c2a9d4b7e8f6a1c3d2e4b5a6978c0d1e2f3a4b5c6d7e8f901
  harness: {id: deepagents, contractVersion: 1}
  sandboxProfileRef: {name: no-such-profile}
  epoch: 0
EOF2
)
echo "$bad" | grep -q 'SandboxProfile "no-such-profile" does not exist in namespace' || fail "webhook did not answer: $bad"
# The API server's own account: it called our webhook and the webhook rejected.
K get --raw /metrics | grep 'apiserver_admission_webhook_admission_duration_seconds_count{' |
  grep 'name="harnessbindings.harness-engine.dev"' | grep -q 'rejected="true"' ||
  fail "the API server recorded no rejection by harnessbindings.harness-engine.dev"
say "webhook (API server -> Service harness-engine-webhook -> operator pod) refused: $(echo "$bad" | head -1 | cut -c1-200)"

# A chat backend starts the conversation through the data plane alone: its own
# ServiceAccount with the documented RBAC (create/get/update on harnessbindings in its
# namespace, impersonation of the end user it acts for), a bind, and the operator's data
# plane creates the HarnessBinding (docs/api.md, "Binding in operator mode").
K -n $APP apply -f - >/dev/null <<EOF2 || fail "chat backend RBAC refused"
apiVersion: v1
kind: ServiceAccount
metadata: {name: chat-backend}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: chat-backend}
rules:
- {apiGroups: [harness-engine.dev], resources: [harnessbindings], verbs: [get, create, update]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: chat-backend}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: chat-backend}
subjects: [{kind: ServiceAccount, name: chat-backend, namespace: $APP}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: $APP-chat-backend-act-for-alice}
rules:
- {apiGroups: [""], resources: [users], verbs: [impersonate], resourceNames: ["user:alice"]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: $APP-chat-backend-act-for-alice}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: $APP-chat-backend-act-for-alice}
subjects: [{kind: ServiceAccount, name: chat-backend, namespace: $APP}]
EOF2
op_ip=$(K -n $NS get pods -l app.kubernetes.io/name=harness-engine -o jsonpath='{.items[0].status.podIP}')
backend_token=$(K -n $APP create token chat-backend --audience harness-engine --duration 10m) || fail "no token for the chat backend"
bound=$(node_curl -sS --max-time 30 -w '\n%{http_code}' -X POST \
  -H "Authorization: Bearer $backend_token" -H 'Harness-Subject: user:alice' \
  -H "Idempotency-Key: bind-$RANDOM$RANDOM" -H 'Content-Type: application/json' \
  -d '{"agent_id":"research-assistant","conversation_id":"conv-0001","harness":"deepagents","sandbox_profile":"python-worker"}' \
  "http://$op_ip:8080/v1/bindings") || fail "bind: $bound"
[[ $(tail -1 <<<"$bound") == 201 ]] || fail "the chat backend's bind was not created (201): $bound"
HB=$(head -1 <<<"$bound" | python3 -c 'import json, sys; print(json.load(sys.stdin)["harness_binding"]["name"])') ||
  fail "the bind's answer names no HarnessBinding: $bound"
say "chat backend (ServiceAccount $APP/chat-backend, acting for user:alice) bound conv-0001 through the data plane: HarnessBinding $APP/$HB created"
K -n $APP delete clusterrole,clusterrolebinding $APP-chat-backend-act-for-alice >/dev/null 2>&1 || true
ready() { [[ $(K -n $APP get harnessbinding "$HB" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') == True ]]; }
gen() { K -n $APP get harnessbinding "$HB" -o jsonpath='{.status.lease.generation}'; }
until_ok 120 "binding not Ready" ready
bid=$(K -n $APP get harnessbinding "$HB" -o jsonpath='{.metadata.labels.harness-engine\.dev/binding-id}')
worker_pod() { K -n $APP get harnessbinding "$HB" -o jsonpath='{.status.lease.workerPodName}'; }
pod=$(worker_pod)
[[ -n $pod ]] || pod=$(K -n $APP get pods -l app.kubernetes.io/name=harness-worker -o jsonpath='{.items[0].metadata.name}')
say "binding $bid Ready at generation $(gen), worker pod $pod"

turn() { # pod message -> prints the JSON reply
  local ip; ip=$(K -n $APP get pod "$1" -o jsonpath='{.status.podIP}')
  node_curl -sS --max-time 60 -H 'Content-Type: application/json' \
    -d "{\"binding_id\":\"$bid\",\"message\":\"$2\"}" "http://$ip:8000/turns"
}
out=$(turn "$pod" hello) || fail "turn 1: $out"
echo "$out" | grep -q '"reply": "turn 1: hello"' || fail "turn 1: $out"
say "turn 1 committed by the worker: $out"

# 5. The worker pod is deleted: a new generation, a new pod, resuming from the head.
g1=$(gen)
token_of() { K -n $APP exec "$1" -- python3 -c 'print(open("/var/run/secrets/harness-engine/token").read())'; }
old_token=$(token_of "$pod") || fail "cannot read the worker's projected token"
K -n $APP delete pod "$pod" --wait=false >/dev/null
replaced() { ready && [[ $(gen) -gt $g1 ]]; }
until_ok 180 "binding not replaced after the pod was deleted" replaced
pod2=$(worker_pod)
[[ -n $pod2 && $pod2 != "$pod" ]] || pod2=$(K -n $APP get pods -l app.kubernetes.io/name=harness-worker --field-selector=status.phase=Running -o jsonpath='{.items[0].metadata.name}')
until_ok 60 "replacement pod not Ready" K -n $APP wait --for=condition=Ready pod/"$pod2" --timeout=2s
out=$(turn "$pod2" again) || fail "turn 2: $out"
echo "$out" | grep -q '"reply": "turn 2: again"' || fail "turn 2 did not resume from the head: $out"
say "generation $g1 -> $(gen); replacement pod $pod2 resumed: $out"
# Late writes at the old generation: with the deleted pod's own token (refused by
# authentication once its pod object is gone, by the fence while it terminates or while
# its TokenReview is cached) and with the live pod's token (refused by the fence).
late() { # token -> "<http status> <body>"
  node_curl -sS --max-time 10 -o /dev/stderr -w '%{http_code}' -X POST \
    -H "Authorization: Bearer $1" -H 'Content-Type: application/octet-stream' \
    -H "Idempotency-Key: late-$RANDOM$RANDOM" -H 'Harness-Epoch: 0' \
    -H "Harness-Lease-Generation: $g1" -H 'Harness-Codec: langgraph.checkpoint.v1' \
    --data-binary 'late' "http://$op_ip:8080/v1/bindings/$bid/state/pending" 2>&1
}
late_old=$(late "$old_token")
[[ $late_old == *'"unauthenticated"'*401 || $late_old == *'"stale_lease"'*409 ]] || fail "the deleted pod's late write was not refused: $late_old"
late_new=$(late "$(token_of "$pod2")")
[[ $late_new == *'"stale_lease"'*409 ]] || fail "a write at generation $g1 was not refused as stale: $late_new"
say "late writes at generation $g1 refused: deleted pod's token -> ${late_old: -3} $(echo "$late_old" | grep -o '"code":"[a-z_]*"'); live pod at the old generation -> 409 stale_lease"

# 6. helm upgrade to a changed image (same binary, new tag): the binding and its head stay.
ctr_ images tag --force \
  localhost/harness-engine/operator:dev localhost/harness-engine/operator:dev-upgrade >/dev/null
# The worker keeps taking turns throughout: the embedded store's Deployment is Recreate
# (one writer), so the data plane is down for a few seconds, and the client's retry window
# (backoff with jitter) must outlast that without losing or repeating a turn.
g2=$(gen)
during=$home/during; : >"$during"
(
  i=0
  while [[ ! -f $home/upgraded ]]; do
    i=$((i + 1))
    r=$(turn "$pod2" "during-$i" 2>&1) || r="FAILED $r"
    echo "$i $r" >>"$during"
  done
) &
turner=$!
"$HELM" upgrade harness-engine "$repo/charts/harness-engine" -n $NS --reuse-values \
  --set image.tag=dev-upgrade --wait --timeout 180s >/dev/null || fail "helm upgrade"
until_ok 60 "binding not Ready after the upgrade" ready
sleep 1; touch "$home/upgraded"; wait "$turner"
[[ $(K -n $NS get deploy harness-engine -o jsonpath='{.spec.template.spec.containers[0].image}') == *:dev-upgrade ]] || fail "upgrade did not change the image"
n=$(wc -l <"$during")
((n >= 2)) || fail "the worker took $n turns during the upgrade"
while read -r i r; do
  want="\"reply\": \"turn $((2 + i)): during-$i\""
  [[ $r == *"$want"* ]] || fail "turn during the upgrade lost or repeated: #$i -> $r"
done <"$during"
out=$(turn "$pod2" upgraded) || fail "turn after the upgrade: $out"
echo "$out" | grep -q "\"reply\": \"turn $((3 + n)): upgraded\"" || fail "turn after the upgrade: $out"
say "helm upgrade kept the binding (generation $g2 -> $(gen)) and its head; $n turns taken during the rolling restart, none lost or repeated; then: $out"

# 7. Bindings deleted (their finalizer releases claims), then helm uninstall.
K -n $APP delete harnessbinding "$HB" --timeout=120s >/dev/null || fail "binding not deleted"
K -n $APP delete sandboxwarmpool python-worker --timeout=60s >/dev/null
"$HELM" uninstall harness-engine -n $NS --wait --timeout 120s >/dev/null || fail "helm uninstall"
gone() { [[ -z $(K -n $APP get sandboxclaims,sandboxes,pods -o name 2>/dev/null) ]] && [[ -z $(K -n $NS get pods -o name 2>/dev/null) ]]; }
until_ok 120 "left behind: $(K -n $APP get sandboxclaims,sandboxes,pods -o name 2>/dev/null | tr '\n' ' ')" gone
say "helm uninstall: no claim, Sandbox or pod left"
# What uninstall keeps on purpose (the identity key Secret and the store's claim: a
# reinstall must find the same conversations) goes with the namespace here.
kept=$(K -n $NS get secret,pvc -o name 2>/dev/null | tr '\n' ' ')
say "kept by helm uninstall (resource policy keep): $kept"
K delete namespace $APP $NS --wait=false >/dev/null
K delete pv harness-engine-data-e2e --wait=false >/dev/null 2>&1 || true
echo "production path: passed in $(printf '%.1f' "$(echo "$(date +%s.%N) - $T0" | bc)")s"
