#!/usr/bin/env bash
# Makes the kubeconfig lbnodeagent reads, for the hostlb-agent ServiceAccount
# of deploy/agent/rbac.yaml, from an admin's kubectl context.
#
#   kubeconfig.sh OUT_DIR [DURATION]
#
# Writes OUT_DIR/kubeconfig and OUT_DIR/token. The kubeconfig names the token
# by file (tokenFile), and the agent re-reads that file, so renewing is only
# running this script again before DURATION (default 8760h) ends and copying
# OUT_DIR/token to the hosts; no agent restart. The API server may cap the
# duration (--service-account-max-token-expiration): the expiry printed at the
# end is the one granted.
set -euo pipefail
out=${1:?usage: kubeconfig.sh OUT_DIR [DURATION]}
duration=${2:-8760h}
ns=hostlb-system
sa=hostlb-agent
kc=(kubectl ${KUBECONFIG:+--kubeconfig "$KUBECONFIG"})

mkdir -p "$out"
server=$("${kc[@]}" config view --minify --raw -o jsonpath='{.clusters[0].cluster.server}')
ca_data=$("${kc[@]}" config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
ca_file=$("${kc[@]}" config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority}')
if [ -z "$ca_data" ] && [ -n "$ca_file" ]; then
  ca_data=$(base64 -w0 <"$ca_file")
fi
[ -n "$ca_data" ] || { echo "kubeconfig.sh: the current context has no certificate authority" >&2; exit 1; }

umask 077
# No trailing newline: the token goes into an HTTP header as read.
"${kc[@]}" -n "$ns" create token "$sa" --duration="$duration" | tr -d '\n' >"$out/token.new"
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
- name: $sa
  user:
    tokenFile: /etc/lbnodeagent/token
contexts:
- name: hostlb
  context: {cluster: hostlb, user: $sa}
current-context: hostlb
K
# The expiry granted, read from the token's claims (base64url).
claims=$(cut -d. -f2 <"$out/token" | tr '_-' '/+')
while [ $((${#claims} % 4)) -ne 0 ]; do claims="$claims="; done
exp=$(printf '%s' "$claims" | base64 -d 2>/dev/null | sed -n 's/.*"exp":\([0-9]*\).*/\1/p' || true)
echo "wrote $out/kubeconfig (reads /etc/lbnodeagent/token) and $out/token"
if [ -n "$exp" ]; then
  echo "the token expires $(date -u -d "@$exp" +%FT%TZ); renew before then"
fi
