#!/usr/bin/env bash
# Builds the lbnodeagent packages: target/packages/lbnodeagent_*.deb and
# target/packages/lbnodeagent-*.rpm, with binaries that run on glibc 2.28
# or newer (RHEL 8, Debian 10, Ubuntu 20.04 and later). Installs what it
# needs first, at pinned versions: Debian's gzip and binutils, the
# crates.io tools cargo-deb and cargo-generate-rpm, and (through
# packaging/zigbuild.sh) cargo-zigbuild and zig from PyPI, which link
# against glibc 2.28's symbols from any build host.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*"; }

CARGO_DEB_VERSION=3.8.0
CARGO_GENERATE_RPM_VERSION=0.21.1
TARGET=x86_64-unknown-linux-gnu

missing=()
command -v gzip >/dev/null || missing+=(gzip)
command -v objdump >/dev/null || missing+=(binutils)
if ((${#missing[@]})); then
  log "apt-get install ${missing[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
for pinned in "cargo-deb $CARGO_DEB_VERSION" "cargo-generate-rpm $CARGO_GENERATE_RPM_VERSION"; do
  read -r tool version <<<"$pinned"
  if [[ $("$tool" --version 2>/dev/null || cargo "${tool#cargo-}" --version 2>/dev/null) != *" $version"* ]]; then
    log "cargo install $tool@$version"
    cargo install --locked "$tool@$version"
  fi
done

# The one release build (see zigbuild.sh): the allocator and the
# simulation come with it, on the same dependencies.
log "packaging/zigbuild.sh"
packaging/zigbuild.sh
out=target/$TARGET/release
bin=$out/lbnodeagent

# The man pages come from the same clap definitions as --help: the main
# one and one per subcommand, which it names in SEE ALSO.
mkdir -p target/packages
rm -rf "$out/man"
"$bin" man --dir "$out/man"
"$out/kubectl-hostlb" man --dir "$out/man"
gzip -9n "$out"/man/*.1
# Every page generated is shipped by both packages: a subcommand added
# without its page in lbnodeagent/Cargo.toml fails here, not at install.
for page in "$out"/man/*.1.gz; do
  name=$(basename "$page")
  (( $(grep -c "target/release/man/$name\"" lbnodeagent/Cargo.toml) == 2 )) \
    || { echo "packaging: $name is not listed for both the .deb and the .rpm in lbnodeagent/Cargo.toml" >&2; exit 1; }
done

# The oldest glibc each binary runs on is the newest symbol version it
# needs; packaging/test.sh fails the packages above the floor.
for b in "$bin" "$out/kubectl-hostlb"; do
  glibc=$(objdump -T "$b" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1)
  echo "$(basename "$b") needs glibc ${glibc#GLIBC_} or newer"
done

log "cargo deb"
rm -f target/packages/lbnodeagent*.deb target/packages/lbnodeagent*.rpm
cargo deb --locked -p lbnodeagent --no-build --target "$TARGET" --output target/packages/
log "cargo generate-rpm"
cargo generate-rpm -p lbnodeagent --target "$TARGET" --output target/packages/

ls -l target/packages/
