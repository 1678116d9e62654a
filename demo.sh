#!/usr/bin/env bash
# The local demo cluster: three hosts, an API server and a client in network
# namespaces on this machine, the real binaries, a VIP failing over and back.
# Builds what it needs, runs as root, tears everything down at the end
# (`--keep` leaves it running). See docs/demo.md.
set -euo pipefail
cd "$(dirname "$0")"
if [ "$(id -u)" != 0 ]; then
  echo "demo: failed needs root: it creates network namespaces, links and addresses (run: sudo ./demo.sh)"
  exit 1
fi
for tool in ip python3; do
  command -v "$tool" >/dev/null || { echo "demo: failed needs $tool (apt-get install iproute2 python3)"; exit 1; }
done
echo "building lbnodeagent, allocator, kubectl-hostlb, kube-testserver and hostlb-demo (first time: a few minutes)"
cargo build -q --bins -p lbnodeagent -p hostlb-allocator -p kubectl-hostlb -p hostlb-tests
exec target/debug/hostlb-demo "$@"
