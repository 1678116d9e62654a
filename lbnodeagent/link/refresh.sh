#!/usr/bin/env bash
# Rewrites hot.ld from agents profiled from start to rest: the idle bench
# with 1,000 VIPs, its holder and a bystander under callgrind, run twice.
#   1. The packages' build (packaging/zigbuild.sh, its symbols kept): the
#      binary operators run. It is built with the allocator, the plugin
#      and the simulation, whose shared dependencies' features change
#      what the compiler inlines, so its functions are not quite this
#      build's.
#   2. This build (the benches' binary), so the benches measure the same
#      layout.
# The list is the union. Needs root (the bench's network namespaces),
# valgrind and about 9 minutes (some 20 with nothing built). Run it when
# the agent's code has moved on: packaging/test.sh fails when the shipped
# agent matches under 90% of the list (matched.py), but only the idle
# bench's resident pages of the binary show hot code the list misses.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v callgrind_control >/dev/null || { echo "refresh.sh needs valgrind" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir "$dir/packaged" "$dir/bench" "$dir/bin"

# Symbols kept: another profile setting, so other crate hashes, which the
# list does not name; the code is the same.
CARGO_PROFILE_RELEASE_STRIP=false packaging/zigbuild.sh
cp "${CARGO_TARGET_DIR:-target}/x86_64-unknown-linux-gnu/release/lbnodeagent" "$dir/bin/lbnodeagent"

profile() {
  IDLE_CALLGRIND=$1 IDLE_RUNS=1 IDLE_SECS="${IDLE_SECS:-20}" IDLE_VIPS=1000 \
    cargo bench -p lbnodeagent --bench idle
}
HOSTLB_AGENT_BINARY=$dir/bin/lbnodeagent profile "$dir/packaged"
profile "$dir/bench"
python3 lbnodeagent/link/hot.py "$dir"/packaged/node-* "$dir"/bench/node-* >lbnodeagent/link/hot.ld.new
mv lbnodeagent/link/hot.ld.new lbnodeagent/link/hot.ld
grep -m1 functions lbnodeagent/link/hot.ld
