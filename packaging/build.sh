#!/usr/bin/env bash
# Builds the lbnodeagent packages: target/packages/lbnodeagent_*.deb and
# target/packages/lbnodeagent-*.rpm. Installs what it needs first: Debian's
# gzip and the crates.io tools cargo-deb and cargo-generate-rpm.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*"; }

command -v gzip >/dev/null || {
  log "apt-get install gzip"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gzip
}
for tool in cargo-deb cargo-generate-rpm; do
  if ! command -v "$tool" >/dev/null; then
    log "cargo install $tool"
    cargo install --locked "$tool"
  fi
done

log "cargo build --release -p lbnodeagent -p kubectl-hostlb"
cargo build --release --locked -p lbnodeagent -p kubectl-hostlb
bin=target/release/lbnodeagent

# The man pages come from the same clap definitions as --help: the main
# one and one per subcommand, which it names in SEE ALSO.
mkdir -p target/packages
rm -rf target/release/man
"$bin" man --dir target/release/man
gzip -9n target/release/man/*.1

# The oldest glibc the binary runs on: the newest symbol version it needs.
glibc=$(objdump -T "$bin" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1)
echo "lbnodeagent needs glibc ${glibc#GLIBC_} or newer"

log "cargo deb"
rm -f target/packages/lbnodeagent*.deb target/packages/lbnodeagent*.rpm
cargo deb --locked -p lbnodeagent --no-build --output target/packages/
log "cargo generate-rpm"
cargo generate-rpm -p lbnodeagent --output target/packages/

ls -l target/packages/
