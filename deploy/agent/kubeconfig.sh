#!/usr/bin/env bash
# Makes one node's identity for lbnodeagent, from an admin's kubectl
# context (docs/agent.md, "Security model"):
#
#   kubeconfig.sh NODE OUT_DIR [DURATION]
#
# - the ServiceAccount hostlb-agents/NODE (deploy/agent/rbac.yaml grants
#   what every agent may do to that namespace's group);
# - a ClusterRole and binding that let it write its own NodeAgent record,
#   named NODE, and no other (RBAC resourceNames);
# - that record, empty, so the agent never needs to create one;
# - OUT_DIR/token, a token for it from the TokenRequest API (DURATION,
#   default 2160h: 90 days; the server may cap it, and the expiry printed
#   at the end is the one granted), and OUT_DIR/kubeconfig, which names the
#   token by file ($TOKEN_FILE, default /etc/lbnodeagent/token).
#
# The agent re-reads the token file, so renewing is running this script
# again and copying OUT_DIR/token to the host; `lbnodeagent check` warns
# from 14 days before the token expires. Revoking one node is deleting its
# ServiceAccount: every token it had stops working, and no other node's.
# Run it again for a node that has it all already: nothing else changes.
set -euo pipefail
node=${1:?usage: kubeconfig.sh NODE OUT_DIR [DURATION]}
out=${2:?usage: kubeconfig.sh NODE OUT_DIR [DURATION]}
duration=${3:-2160h}
token_file=${TOKEN_FILE:-/etc/lbnodeagent/token}
ns=hostlb-agents
kc=(kubectl ${KUBECONFIG:+--kubeconfig "$KUBECONFIG"})

# Durations as kubectl writes them: hours, minutes or seconds.
case $duration in
  *h) seconds=$(( ${duration%h} * 3600 )) ;;
  *m) seconds=$(( ${duration%m} * 60 )) ;;
  *s) seconds=${duration%s} ;;
  *) echo "kubeconfig.sh: DURATION is like 2160h, 90m or 3600s, not $duration" >&2; exit 1 ;;
esac

mkdir -p "$out"
server=$("${kc[@]}" config view --minify --raw -o jsonpath='{.clusters[0].cluster.server}')
ca_data=$("${kc[@]}" config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
ca_file=$("${kc[@]}" config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority}')
if [ -z "$ca_data" ] && [ -n "$ca_file" ]; then
  ca_data=$(base64 -w0 <"$ca_file")
fi
[ -n "$ca_data" ] || { echo "kubeconfig.sh: the current context has no certificate authority" >&2; exit 1; }

"${kc[@]}" apply -f - >/dev/null <<Y
apiVersion: v1
kind: ServiceAccount
metadata:
  name: $node
  namespace: $ns
  labels: {app.kubernetes.io/name: hostlb-agent, app.kubernetes.io/part-of: hostlb}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: hostlb-agent:$node
  labels: {app.kubernetes.io/name: hostlb-agent, app.kubernetes.io/part-of: hostlb}
rules:
# This node's record and its status, and no other node's.
- apiGroups: [hostlb.io]
  resources: [nodeagents, nodeagents/status]
  resourceNames: ["$node"]
  verbs: [get, patch, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: hostlb-agent:$node
  labels: {app.kubernetes.io/name: hostlb-agent, app.kubernetes.io/part-of: hostlb}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "hostlb-agent:$node"}
subjects:
- {kind: ServiceAccount, name: "$node", namespace: $ns}
---
apiVersion: hostlb.io/v1
kind: NodeAgent
metadata:
  name: $node
spec: {}
Y

umask 077
# No trailing newline: the token goes into an HTTP header as read.
request='{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"expirationSeconds":'$seconds'}}'
printf '%s' "$request" >"$out/token-request.json"
"${kc[@]}" create --raw "/api/v1/namespaces/$ns/serviceaccounts/$node/token" -f "$out/token-request.json" \
  | sed -n 's/.*"token":"\([^"]*\)".*/\1/p' | tr -d '\n' >"$out/token.new"
rm -f "$out/token-request.json"
[ -s "$out/token.new" ] || { echo "kubeconfig.sh: the API server gave no token" >&2; exit 1; }
mv "$out/token.new" "$out/token"
cat >"$out/kubeconfig" <<K
apiVersion: v1
kind: Config
clusters:
- name: hostlb
  cluster:
    server: "$server"
    certificate-authority-data: $ca_data
users:
- name: $node
  user:
    tokenFile: $token_file
contexts:
- name: hostlb
  context: {cluster: hostlb, user: "$node"}
current-context: hostlb
K
# The expiry granted, read from the token's claims (base64url).
claims=$(cut -d. -f2 <"$out/token" | tr '_-' '/+')
while [ $((${#claims} % 4)) -ne 0 ]; do claims="$claims="; done
exp=$(printf '%s' "$claims" | base64 -d 2>/dev/null | sed -n 's/.*"exp":\([0-9]*\).*/\1/p' || true)
echo "wrote $out/kubeconfig (reads $token_file) and $out/token for node $node"
if [ -n "$exp" ]; then
  echo "the token expires $(date -u -d "@$exp" +%FT%TZ); renew before then"
fi
