#!/usr/bin/env bash
# Tests the allocator image that packaging/image.sh builds:
#   1. two builds give the same archive, byte for byte (so one digest);
#   2. skopeo reads it as an OCI archive, and umoci unpacks it;
#   3. its entrypoint, run from the unpacked root as the image's user
#      (65532) with nothing of the host's files, allocates an address on a
#      real kube-apiserver (../shared/kube-apiserver) as the shipped
#      ServiceAccount with the shipped RBAC, in a network namespace of its
#      own.
# Needs root. Installs umoci and skopeo (Debian) when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*"; }
fail() { echo "image-test: $*" >&2; exit 1; }

missing=()
command -v umoci >/dev/null || missing+=(umoci)
command -v skopeo >/dev/null || missing+=(skopeo)
command -v kubectl >/dev/null || missing+=(kubernetes-client)
if ((${#missing[@]})); then
  log "apt-get install ${missing[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
archive=target/packages/allocator-$version.oci.tar

log "packaging/image.sh, twice"
packaging/image.sh
first=$(sha256sum "$archive" | cut -d' ' -f1)
IMAGE_NO_BUILD=1 packaging/image.sh
second=$(sha256sum "$archive" | cut -d' ' -f1)
[[ $first == "$second" ]] || fail "two builds differ: $first and $second"
echo "reproducible: both archives are sha256:$first"

work=$(mktemp -d)
ns=hlb-image-$$
allocator_pid=""
cleanup() {
  [[ -z $allocator_pid ]] || kill "$allocator_pid" 2>/dev/null || true
  if ip netns list | grep -q "^$ns"; then
    ip netns exec "$ns" ../shared/kube-apiserver/run.sh stop "$work/api" >/dev/null 2>&1 || true
    umount "$work/bundle/rootfs/var/run/secrets/kubernetes.io/serviceaccount" 2>/dev/null || true
    ip netns delete "$ns"
  fi
  rm -rf "$work"
}
trap cleanup EXIT

log "skopeo inspect, umoci unpack"
skopeo inspect "oci-archive:$archive" | grep -q '"Architecture": "amd64"' || fail "skopeo cannot read it"
mkdir "$work/oci"
tar -xf "$archive" -C "$work/oci"
umoci unpack --image "$work/oci:$version" "$work/bundle" >/dev/null
rootfs=$work/bundle/rootfs
# What the runtime would run, from the image's own config.
read -r uid gid args < <(python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))["process"]
print(p["user"]["uid"], p["user"]["gid"], " ".join(p["args"]))' "$work/bundle/config.json")
[[ $uid == 65532 && $gid == 65532 ]] || fail "the image runs as $uid:$gid, not 65532"
[[ $args == "/allocator run" ]] || fail "entrypoint and command: $args"
[[ ! -e $rootfs/bin/sh ]] || fail "the image has a shell"

log "the real kube-apiserver in $ns"
ip netns add "$ns"
ip netns exec "$ns" ip link set lo up
ip netns exec "$ns" ../shared/kube-apiserver/run.sh start "$work/api" >/dev/null
admin=$work/api/admin.kubeconfig
k() { ip netns exec "$ns" kubectl --kubeconfig "$admin" "$@"; }
k apply -f deploy/namespace.yaml -f deploy/crds/ -f deploy/allocator/rbac.yaml >/dev/null
k wait --for condition=established --timeout=60s crd/ipaddresspools.hostlb.io >/dev/null

# The ServiceAccount's token, as the kubelet would mount it.
secrets=$work/secrets
mkdir -p "$secrets"
ip netns exec "$ns" curl -sf --cacert "$work/api/pki/ca.crt" \
  -H "Authorization: Bearer $(cat "$work/api/pki/admin.token")" -H 'Content-Type: application/json' \
  -X POST -d '{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"audiences":["https://kubernetes.default.svc"],"expirationSeconds":3600}}' \
  https://127.0.0.1:6443/api/v1/namespaces/hostlb-system/serviceaccounts/hostlb-allocator/token |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["status"]["token"], end="")' >"$secrets/token"
cp "$work/api/pki/ca.crt" "$secrets/ca.crt"
printf hostlb-system >"$secrets/namespace"
chmod 0644 "$secrets"/*
mkdir -p "$rootfs/var/run/secrets/kubernetes.io/serviceaccount"

log "the image's entrypoint as 65532, in its own root"
ip netns exec "$ns" unshare --mount sh -c "
  mount --bind '$secrets' '$rootfs/var/run/secrets/kubernetes.io/serviceaccount'
  exec env -i KUBERNETES_SERVICE_HOST=127.0.0.1 KUBERNETES_SERVICE_PORT=6443 \
    POD_NAME=allocator-0 POD_NAMESPACE=hostlb-system HOSTLB_METRICS_LISTEN=127.0.0.1:7472 \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    "$(command -v chroot)" --userspec=65532:65532 '$rootfs' $args
" >"$work/allocator.log" 2>&1 &
allocator_pid=$!

k apply -f - >/dev/null <<'Y'
apiVersion: hostlb.io/v1
kind: IPAddressPool
metadata: {name: image-test, namespace: hostlb-system}
spec: {addresses: [10.123.0.10-10.123.0.20]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: LoadBalancer
  ports: [{port: 80, protocol: TCP}]
Y
address=""
for _ in $(seq 300); do
  address=$(k get service web -o 'jsonpath={.status.loadBalancer.ingress[0].ip}' 2>/dev/null || true)
  [[ -n $address ]] && break
  kill -0 "$allocator_pid" 2>/dev/null || { cat "$work/allocator.log" >&2; fail "the allocator exited"; }
  sleep 0.1
done
[[ $address == 10.123.0.1[0-9] || $address == 10.123.0.20 ]] || {
  cat "$work/allocator.log" >&2
  fail "no address from the pool (got '$address')"
}
user=$(ps -o user= -p "$(pgrep -f -n '^/allocator run')" 2>/dev/null || true)
[[ $user == 65532 ]] || fail "the allocator runs as '$user', not 65532"
echo "image-test: ok: the image (sha256:$first) allocated $address as user 65532"
