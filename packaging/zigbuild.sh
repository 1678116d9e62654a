#!/usr/bin/env bash
# `cargo build --release "$@"` against glibc 2.28's symbols, so that what
# it builds runs on RHEL 8, Debian 10, Ubuntu 20.04 and newer: cargo-zigbuild
# with zig (ziglang) as the linker and C compiler, both from PyPI at pinned
# versions, installed under target/ on first use. Outputs land in
# target/x86_64-unknown-linux-gnu/release/.
#
# Without a package named it builds everything shipped (the agent, the kubectl
# plugin, the allocator) and the agent core's simulation (feature `sim`,
# not shipped), in one build: packaging/build.sh and packaging/image.sh
# both call it so, and CI runs the simulation from it. One selection
# matters: cargo unifies the dependencies' features over what one build
# selects, so a build of the allocator alone after the agent's compiles
# most dependencies again (3.5 minutes on 2 cores), and so would the
# simulation as an example (it brings the dev-dependencies).
set -euo pipefail
cd "$(dirname "$0")/.."

# Reproducible, and the same for every caller: build scripts (ring's,
# zstd's) rebuild when it changes, and with them most of the tree, so
# packaging/image.sh, which needs it, must not be the only one to set it.
: "${SOURCE_DATE_EPOCH:=$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
export SOURCE_DATE_EPOCH

selected=no
for arg in "$@"; do
  [[ $arg == -p* || $arg == --package* || $arg == --workspace ]] && selected=yes
done
if [[ $selected == no ]]; then
  set -- "$@" -p lbnodeagent -p kubectl-hostlb -p hostlb-allocator --features lbnodeagent/sim
fi

CARGO_ZIGBUILD_VERSION=0.24.1
ZIGLANG_VERSION=0.17.1
GLIBC_FLOOR=2.28
TARGET=x86_64-unknown-linux-gnu

if ! python3 -m pip --version >/dev/null 2>&1; then
  printf '\n== apt-get install python3-pip\n'
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip
fi
zig_dir=target/zigbuild-$CARGO_ZIGBUILD_VERSION-$ZIGLANG_VERSION
if [[ ! -x $zig_dir/bin/cargo-zigbuild ]]; then
  printf '\n== pip install cargo-zigbuild==%s ziglang==%s\n' "$CARGO_ZIGBUILD_VERSION" "$ZIGLANG_VERSION"
  rm -rf "$zig_dir"
  python3 -m pip install --quiet --disable-pip-version-check --break-system-packages --target "$zig_dir" \
    "cargo-zigbuild==$CARGO_ZIGBUILD_VERSION" "ziglang==$ZIGLANG_VERSION"
fi
export PYTHONPATH=$PWD/$zig_dir${PYTHONPATH:+:$PYTHONPATH}
exec "$zig_dir/bin/cargo-zigbuild" zigbuild --release --locked --target "$TARGET.$GLIBC_FLOOR" "$@"
