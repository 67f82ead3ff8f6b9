# Shared by the tiers that run the production path on a node whose pods really run: the
# real-node tier (e2e/scripts/realnode.sh, the host is the node) and `make kind-e2e`
# (e2e/scripts/kind-e2e.sh, the node is a kind container). Source it; it defines how the
# scripts reach the node's containerd, a shell and curl on the node, and the worker pods'
# node selector. Every step after cluster creation (production-path.sh, install-doc.sh)
# goes through these, so both tiers run the same steps.
#
#   HARNESS_E2E_NODE_EXEC   command prefix that runs a command on the node (empty: the
#                           host is the node, as on the real-node tier; kind:
#                           "docker exec <node container>")
#   HARNESS_E2E_CTR         how to call ctr for the node's containerd (default: the real
#                           node's socket under $HARNESS_E2E_RUN)
#   HARNESS_E2E_NODE_SELECTOR  the worker pods' nodeSelector, as YAML flow (default
#                           {type: real}, the label realnode.sh gives its node)
# shellcheck shell=bash
read -r -a _node_exec <<<"${HARNESS_E2E_NODE_EXEC:-}"
if [[ -n ${HARNESS_E2E_CTR:-} ]]; then
  read -r -a _ctr <<<"$HARNESS_E2E_CTR"
else
  _ctr=(ctr -a "${HARNESS_E2E_RUN:?HARNESS_E2E_RUN}/containerd/containerd.sock")
fi
NODE_SELECTOR=${HARNESS_E2E_NODE_SELECTOR:-"{type: real}"}
# ctr_ ARGS...: ctr in containerd's k8s.io namespace (the kubelet's images).
ctr_() { "${_node_exec[@]}" "${_ctr[@]}" -n k8s.io "$@"; }
# node_sh SCRIPT: a shell command on the node (directories for hostPath volumes).
node_sh() { "${_node_exec[@]}" sh -c "$1"; }
# node_curl ARGS...: curl from the node, which reaches pod IPs on both tiers.
node_curl() { "${_node_exec[@]}" curl "$@"; }
# tag_by_digest: every localhost/harness-engine image also under name@manifest-digest, as
# a registry pull records it: a pod template pinned by digest (what a SandboxProfile
# requires) then resolves locally, and the kubelet reports that digest as the imageID.
tag_by_digest() {
  local name digest
  while read -r name digest; do
    [[ $name == localhost/harness-engine/*:* ]] || continue
    ctr_ images tag --force "$name" "${name%:*}@$digest" >/dev/null
  done < <(ctr_ images ls | awk 'NR > 1 {print $1, $3}')
}
