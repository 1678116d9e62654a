#!/usr/bin/env bash
# `cargo build --release "$@"` against glibc 2.28's symbols, so that what
# it builds runs on RHEL 8, Debian 10, Ubuntu 20.04 and newer: cargo-zigbuild
# with zig (ziglang) as the linker and C compiler, both from PyPI at pinned
# versions, installed under target/ on first use. Outputs land in
# target/x86_64-unknown-linux-gnu/release/. packaging/build.sh builds the
# packaged binaries with it; CI builds the simulation with it too, so that
# both share one set of release dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."

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
