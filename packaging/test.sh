#!/usr/bin/env bash
# Checks the packages packaging/build.sh left in target/packages: lintian and
# rpmlint, the unit (systemd-analyze verify and security), and the .deb
# installed, upgraded, removed and purged in a fresh Debian 12 root made by
# debootstrap; the .rpm's file list, config flag and scripts, and an install
# with `rpm --root`. Booting the unit needs systemd-nspawn on a host whose
# cgroups it can use; where it cannot, this says so and why (never silently).
# Needs root. Prints "packaging test: ok" at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*"; }
fail() {
  echo "packaging test: FAIL: $*" >&2
  exit 1
}
ok() { echo "  ok: $*"; }

apt_packages=()
command -v lintian >/dev/null || apt_packages+=(lintian)
command -v rpmlint >/dev/null || apt_packages+=(rpmlint)
command -v rpm >/dev/null || apt_packages+=(rpm)
command -v debootstrap >/dev/null || apt_packages+=(debootstrap)
command -v systemd-nspawn >/dev/null || apt_packages+=(systemd-container)
command -v kubectl >/dev/null || apt_packages+=(kubernetes-client)
# The signed repository: a throwaway key, and what packaging/repo.sh uses.
command -v gpg >/dev/null || apt_packages+=(gnupg)
command -v gpgv >/dev/null || apt_packages+=(gpgv)
command -v apt-ftparchive >/dev/null || apt_packages+=(apt-utils)
command -v createrepo_c >/dev/null || apt_packages+=(createrepo-c)
if ((${#apt_packages[@]})); then
  log "apt-get install ${apt_packages[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_packages[@]}"
fi

shopt -s nullglob
debs=(target/packages/lbnodeagent_*.deb)
rpms=(target/packages/lbnodeagent-*.rpm)
((${#debs[@]} == 1)) || fail "expected one .deb in target/packages (run packaging/build.sh): ${debs[*]:-none}"
((${#rpms[@]} == 1)) || fail "expected one .rpm in target/packages (run packaging/build.sh): ${rpms[*]:-none}"
deb=${debs[0]}
rpm=${rpms[0]}
work=target/packaging
mkdir -p "$work"

log "glibc floor of the packaged binaries"
floor=$(sed -n 's/^GLIBC_FLOOR=//p' packaging/zigbuild.sh)
newest() { grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n 1; }
at_most_floor() { [[ $(printf '%s\n%s\n' "$1" "$floor" | sort -V | tail -n 1) == "$floor" ]]; }
rm -rf "$work/unpacked"
mkdir -p "$work/unpacked"
dpkg-deb -x "$deb" "$work/unpacked"
for b in usr/bin/lbnodeagent usr/bin/kubectl-hostlb; do
  need=$(objdump -T "$work/unpacked/$b" | newest)
  at_most_floor "$need" || fail "the .deb's $b needs glibc $need, above $floor"
  ok "the .deb's $b needs glibc $need (floor $floor)"
done
depends=$(dpkg-deb -f "$deb" Depends)
[[ $depends == *"libc6 (>= $floor)"* ]] || fail "the .deb does not depend on libc6 (>= $floor): $depends"
need=$(rpm -qp --requires "$rpm" 2>/dev/null | newest)
at_most_floor "$need" || fail "the .rpm requires glibc $need, above $floor"
ok "the .deb depends on libc6 (>= $floor); the .rpm requires at most GLIBC_$need"

log "the packaged agent's hot code, laid together (lbnodeagent/link/hot.ld)"
# The agent's memory row counts on it (docs/agent.md, "Hot code laid
# together"): without the section, or with a list gone stale (renamed
# functions, a v0 mangling lost from the build), its code spreads over
# the whole text again. matched.py counts the functions laid in
# .text.hot (by their unwind entries: the binary is stripped) against
# those the list names, and fails under 90%.
python3 lbnodeagent/link/matched.py "$work/unpacked/usr/bin/lbnodeagent" lbnodeagent/link/hot.ld ||
  fail "the packaged agent's .text.hot holds under 90% of the functions hot.ld lists: lbnodeagent/link/refresh.sh rewrites the list"
ok "the packaged agent's hot code matches the list"

log "lintian $deb"
# Errors fail; warnings are printed and explained in packaging/README.md.
lintian --fail-on error "$deb" || fail "lintian reports errors"
ok "lintian: no errors"

log "rpmlint $rpm"
rpmlint -c packaging/rpm/rpmlint.toml "$rpm" || fail "rpmlint reports errors"
ok "rpmlint: no errors"

log "systemd-analyze security"
security=$(systemd-analyze security --offline=yes --no-pager systemd/lbnodeagent.service)
echo "$security" | tail -n 1
score=$(echo "$security" | sed -n 's/.*Overall exposure level for .*: \([0-9.]*\).*/\1/p')
[[ -n $score ]] || fail "no exposure score from systemd-analyze security"
awk -v s="$score" 'BEGIN { exit !(s <= 2.0) }' || fail "exposure $score is above 2.0"
ok "exposure level $score"

# A fresh Debian 12 root, made once by debootstrap and unpacked anew for
# every run: minbase with systemd (for systemd-analyze verify and a boot),
# procps (the unit's /bin/kill), man-db (its Documentation=),
# ca-certificates (the agent loads the system's CA roots) and nftables
# (the agent's firewall runs `nft`): the package's dependencies, which
# `dpkg -i` does not fetch.
base=$work/bookworm-minbase-systemd-procps-man-ca-nft.tar.gz
if [[ ! -f $base ]]; then
  log "debootstrap bookworm (once, cached in $base)"
  rm -rf "$work/rootfs.new"
  debootstrap --variant=minbase --include=systemd,passwd,procps,man-db,ca-certificates,nftables bookworm "$work/rootfs.new" \
    http://deb.debian.org/debian
  tar -C "$work/rootfs.new" -czf "$base" .
  rm -rf "$work/rootfs.new"
fi
root=$(realpath "$work")/root
rm -rf "$root"
mkdir -p "$root"
tar -C "$root" -xzf "$base"
in_root() { chroot "$root" "$@"; }

# The same binary as a newer package, for the upgrade.
log "a newer build for the upgrade"
upgrade_dir=$work/upgrade
rm -rf "$upgrade_dir"
cargo deb -p lbnodeagent --no-build --target x86_64-unknown-linux-gnu --deb-revision 2 --output "$upgrade_dir/" >/dev/null
upgrade=$(echo "$upgrade_dir"/lbnodeagent_*.deb)
[[ -f $upgrade ]] || fail "no upgrade package built"

log "dpkg -i $deb into a fresh Debian 12 root"
cp "$deb" "$root/tmp/lbnodeagent.deb"
cp "$upgrade" "$root/tmp/lbnodeagent-upgrade.deb"
in_root dpkg -i /tmp/lbnodeagent.deb

mode_owner() {
  local got
  got=$(stat -c '%a %U:%G' "$root$1") || fail "$1 is not installed"
  [[ $got == "$2" ]] || fail "$1 is $got, expected $2"
  ok "$1 $got"
}
mode_owner /usr/bin/lbnodeagent "755 root:root"
mode_owner /usr/bin/kubectl-hostlb "755 root:root"
in_root kubectl-hostlb --help | grep -q 'explain' || fail "kubectl-hostlb does not run in the installed root"
# --version names the commit built, for bug reports.
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
for b in lbnodeagent kubectl-hostlb; do
  v=$(in_root "$b" --version)
  [[ $v == "$b "*"+$commit"* ]] || fail "$b --version is '$v', not naming commit $commit"
done
ok "--version names the commit: $(in_root lbnodeagent --version)"
mode_owner /etc/lbnodeagent "755 root:root"
mode_owner /etc/lbnodeagent/lbnodeagent.toml "644 root:root"
unit=/lib/systemd/system/lbnodeagent.service
[[ -f $root$unit ]] || unit=/usr/lib/systemd/system/lbnodeagent.service
mode_owner "$unit" "644 root:root"
cmp "$root$unit" systemd/lbnodeagent.service || fail "the installed unit differs from systemd/lbnodeagent.service"
mode_owner /usr/lib/sysusers.d/lbnodeagent.conf "644 root:root"
mode_owner /usr/share/man/man1/lbnodeagent.1.gz "644 root:root"
# Every page the main one names is installed too.
pages=$(zcat "$root/usr/share/man/man1/lbnodeagent.1.gz" | grep -o 'lbnodeagent\\-[a-z]*(1)' | sed 's/\\-/-/; s/(1)//')
(( $(wc -w <<<"$pages") >= 6 )) || fail "the man page names too few subcommand pages: $pages"
for page in $pages; do
  mode_owner "/usr/share/man/man1/$page.1.gz" "644 root:root"
done
mode_owner /usr/share/doc/lbnodeagent/agent.md "644 root:root"
mode_owner /usr/share/doc/lbnodeagent/copyright "644 root:root"
# The opt-in ARP drop-in: shipped, not active, and what sysctl accepts.
mode_owner /usr/share/lbnodeagent/sysctl.d/90-lbnodeagent-arp.conf "644 root:root"
[[ ! -e $root/etc/sysctl.d/90-lbnodeagent-arp.conf ]] || fail "the ARP drop-in is active without being asked for"
grep -qx 'net.ipv4.conf.all.arp_ignore = 1' "$root/usr/share/lbnodeagent/sysctl.d/90-lbnodeagent-arp.conf" ||
  fail "the ARP drop-in does not set arp_ignore"
zcat "$root/usr/share/man/man1/lbnodeagent.1.gz" | grep -q '^\.TH lbnodeagent 1' || fail "the man page has no .TH header"
zcat "$root/usr/share/man/man1/lbnodeagent.1.gz" | grep -q 'cleanup' || fail "the man page does not list the subcommands"
# kubectl-hostlb has its pages too, one per subcommand it names.
mode_owner /usr/share/man/man1/kubectl-hostlb.1.gz "644 root:root"
kpages=$(zcat "$root/usr/share/man/man1/kubectl-hostlb.1.gz" | grep -o 'kubectl\\-hostlb\\-[a-z]*(1)' | sed 's/\\-/-/g; s/(1)//')
(( $(wc -w <<<"$kpages") >= 3 )) || fail "kubectl-hostlb's man page names too few subcommand pages: $kpages"
for page in $kpages; do
  mode_owner "/usr/share/man/man1/$page.1.gz" "644 root:root"
done
ok "man pages generated from the clap definitions, lbnodeagent's and kubectl-hostlb's"

user=$(in_root getent passwd lbnodeagent) || fail "no lbnodeagent user"
[[ $user == lbnodeagent:x:*:*:*:/nonexistent:/usr/sbin/nologin ]] || fail "lbnodeagent user is $user"
uid=$(echo "$user" | cut -d: -f3)
((uid < 1000)) || fail "lbnodeagent is not a system user (uid $uid)"
ok "system user: $user"

link=$root/etc/systemd/system/multi-user.target.wants/lbnodeagent.service
[[ -L $link ]] || fail "the unit is not enabled (no $link)"
ok "enabled: $(readlink "$link")"
grep -qx /etc/lbnodeagent/lbnodeagent.toml "$root/var/lib/dpkg/info/lbnodeagent.conffiles" ||
  fail "/etc/lbnodeagent/lbnodeagent.toml is not a conffile"
ok "conffile /etc/lbnodeagent/lbnodeagent.toml"

# Every commented key is at a valid default: uncommented, the file checks.
# The three worked out at run time are shown with examples. `check` also
# reads the kubeconfig and the gossip key the file names: without a key it
# fails naming the file.
sed -E 's/^#([a-z_]+ = )/\1/; s|^kubeconfig = .*|kubeconfig = "/tmp/kubeconfig"|' packaging/lbnodeagent.toml \
  >"$root/tmp/all-keys.toml"
cat >"$root/tmp/kubeconfig" <<'KUBECONFIG'
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://10.0.0.1:6443", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
KUBECONFIG
chmod 0600 "$root/tmp/kubeconfig"
if out=$(in_root lbnodeagent check --config /tmp/all-keys.toml 2>&1); then
  fail "check passed without the gossip key file: $out"
fi
grep -q /etc/lbnodeagent/gossip.key <<<"$out" || fail "check without a gossip key does not name the file: $out"
ok "check fails without the gossip key file, naming it"
in_root lbnodeagent keygen --output /etc/lbnodeagent/gossip.key
mode_owner /etc/lbnodeagent/gossip.key "600 root:root"
in_root lbnodeagent keygen --output /etc/lbnodeagent/gossip.key 2>/dev/null &&
  fail "keygen --output replaced an existing key"
ok "keygen --output writes 0600 and never replaces a key"
chmod 0644 "$root/tmp/kubeconfig"
if out=$(in_root lbnodeagent check --config /tmp/all-keys.toml 2>&1); then
  fail "check passed with a token in a kubeconfig others can read: $out"
fi
grep -q "/tmp/kubeconfig .*mode 0644" <<<"$out" || fail "check does not name the readable kubeconfig and its mode: $out"
ok "check refuses a credential others can read, naming the file and its mode"
chmod 0600 "$root/tmp/kubeconfig"
in_root lbnodeagent check --config /tmp/all-keys.toml || fail "the default config, uncommented, does not check"
grep -Eq '^#?(node_name|kubeconfig|run_dir|namespace|load_balancer_class) = ' packaging/lbnodeagent.toml
for key in node_name kubeconfig run_dir namespace load_balancer_class listen advertise seeds \
  key_file interval cluster_id phi_threshold interface virtual_interface address_lifetime \
  garp_count garp_interval refresh_interval; do
  grep -Eq "^#$key = " packaging/lbnodeagent.toml || fail "the default config lacks $key"
done
ok "the default config names every key and checks uncommented"


log "systemd-analyze verify in the root"
in_root systemd-analyze verify "$unit" || fail "systemd-analyze verify $unit"
ok "systemd-analyze verify"

log "upgrade keeps an edited config"
echo 'namespace = "edited"' >>"$root/etc/lbnodeagent/lbnodeagent.toml"
in_root dpkg -i /tmp/lbnodeagent-upgrade.deb
grep -qx 'namespace = "edited"' "$root/etc/lbnodeagent/lbnodeagent.toml" || fail "the upgrade lost the edited config"
[[ $(in_root dpkg-query -W -f '${Version}' lbnodeagent) == *-2 ]] || fail "the upgrade did not install"
ok "upgraded to $(in_root dpkg-query -W -f '${Version}' lbnodeagent), edit kept"

log "remove keeps the config, purge drops it"
in_root dpkg -r lbnodeagent
[[ ! -e $root/usr/bin/lbnodeagent ]] || fail "remove left /usr/bin/lbnodeagent"
grep -qx 'namespace = "edited"' "$root/etc/lbnodeagent/lbnodeagent.toml" || fail "remove dropped the config"
[[ -f $root/etc/lbnodeagent/gossip.key ]] || fail "remove dropped the gossip key"
ok "removed; config and key kept"
in_root dpkg -P lbnodeagent
[[ ! -e $root/etc/lbnodeagent ]] || fail "purge left /etc/lbnodeagent"
[[ ! -e $link ]] || fail "purge left the enablement link"
ok "purged: /etc/lbnodeagent and the enablement link are gone"

log "a signed repository (packaging/repo.sh): apt install, then apt upgrade"
# A throwaway signing key, and a second one nobody trusts.
export GNUPGHOME=$(realpath "$work")/gnupg
# A gpg-agent left from an earlier run holds sockets in the old directory.
[[ ! -d $GNUPGHOME ]] || gpgconf --kill gpg-agent || true
rm -rf "$GNUPGHOME"
mkdir -m 0700 "$GNUPGHOME"
gpg --batch --quiet --passphrase '' --quick-gen-key "hostlb test repository <repo@hostlb.invalid>" rsa3072 sign never
gpg --batch --quiet --passphrase '' --quick-gen-key "someone else <other@hostlb.invalid>" rsa3072 sign never
# The first release alone; then the repository with the newer one added.
rm -rf "$root/srv/hostlb"
packaging/repo.sh --key repo@hostlb.invalid --out "$root/srv/hostlb/one" "$deb" "$rpm" >/dev/null
cp -a "$root/srv/hostlb/one" "$root/srv/hostlb/two"
packaging/repo.sh --key repo@hostlb.invalid --out "$root/srv/hostlb/two" "$upgrade" >/dev/null
gpgv --keyring "$root/srv/hostlb/two/hostlb.gpg" "$root/srv/hostlb/two/apt/dists/stable/InRelease" 2>/dev/null ||
  fail "InRelease does not verify with the published key"
gpgv --keyring "$root/srv/hostlb/two/hostlb.gpg" "$root/srv/hostlb/two/rpm/repodata/repomd.xml.asc" \
  "$root/srv/hostlb/two/rpm/repodata/repomd.xml" 2>/dev/null || fail "repomd.xml.asc does not verify with the published key"
ok "InRelease and repomd.xml.asc verify with the published key"
gpgconf --kill gpg-agent || true
# The client side, as packaging/README.md documents it, with nothing but
# this repository configured (the root has no network to rely on).
: >"$root/etc/apt/sources.list"
install -m 0644 "$root/srv/hostlb/one/hostlb.gpg" "$root/usr/share/keyrings/hostlb.gpg"
sources() {
  printf 'Types: deb\nURIs: file:/srv/hostlb/%s/apt\nSuites: stable\nComponents: main\nSigned-By: %s\n' "$1" "$2" \
    >"$root/etc/apt/sources.list.d/hostlb.sources"
}
apt_root() { in_root env DEBIAN_FRONTEND=noninteractive apt-get -q -y "$@"; }
# Signed by a key apt was not told to trust: refused.
gpg --batch --export other@hostlb.invalid >"$root/usr/share/keyrings/other.gpg"
sources one /usr/share/keyrings/other.gpg
apt_root update >"$work/apt-wrong-key.log" 2>&1 || true
if in_root apt-cache show lbnodeagent >/dev/null 2>&1; then
  cat "$work/apt-wrong-key.log"
  fail "apt accepted the repository with a key that did not sign it"
fi
grep -q 'NO_PUBKEY' "$work/apt-wrong-key.log" || { cat "$work/apt-wrong-key.log"; fail "apt did not name the missing key"; }
ok "apt refuses the repository under a key that did not sign it"
sources one /usr/share/keyrings/hostlb.gpg
apt_root update >"$work/apt-update.log" 2>&1 || { cat "$work/apt-update.log"; fail "apt-get update from the repository"; }
grep -q 'NO_PUBKEY\|not signed\|insecure' "$work/apt-update.log" && { cat "$work/apt-update.log"; fail "apt warned about the signature"; }
apt_root install lbnodeagent >/dev/null || fail "apt-get install lbnodeagent from the repository"
[[ $(in_root dpkg-query -W -f '${Version}' lbnodeagent) == *-1 ]] || fail "apt did not install the first release"
echo 'namespace = "edited"' >>"$root/etc/lbnodeagent/lbnodeagent.toml"
sources two /usr/share/keyrings/hostlb.gpg
apt_root update >/dev/null 2>&1 || fail "apt-get update after the newer release was added"
apt_root upgrade >/dev/null || fail "apt-get upgrade"
[[ $(in_root dpkg-query -W -f '${Version}' lbnodeagent) == *-2 ]] || fail "apt-get upgrade did not install the newer release"
grep -qx 'namespace = "edited"' "$root/etc/lbnodeagent/lbnodeagent.toml" || fail "apt-get upgrade lost the edited config"
ok "apt-get install from the signed repository, then apt-get upgrade to $(in_root dpkg-query -W -f '${Version}' lbnodeagent), edit kept"
apt_root purge lbnodeagent >/dev/null
# The dnf side: the .rpm is signed by the repository key, the metadata
# lists both releases. dnf itself is not run here (a Debian host).
rpm --root "$root" --initdb
rpm --root "$root" --import "$root/srv/hostlb/two/hostlb.asc"
for r in "$root"/srv/hostlb/two/rpm/*.rpm; do
  rpm --root "$root" -K "$r" | grep -q 'digests signatures OK' || fail "$(basename "$r") is not signed by the repository key"
done
primary=$(echo "$root"/srv/hostlb/two/rpm/repodata/*-primary.xml.gz)
zcat "$primary" | grep -q '<name>lbnodeagent</name>' || fail "the dnf metadata does not list lbnodeagent"
ok "the .rpm checks against the repository key (rpm -K); createrepo_c's metadata lists it"

log "rpm -qp $rpm"
files=$(rpm -qlp "$rpm")
echo "$files"
for f in /usr/bin/lbnodeagent /usr/bin/kubectl-hostlb /etc/lbnodeagent/lbnodeagent.toml /usr/lib/systemd/system/lbnodeagent.service \
  /usr/lib/sysusers.d/lbnodeagent.conf /usr/share/man/man1/lbnodeagent.1.gz /usr/share/doc/lbnodeagent/agent.md \
  /usr/share/lbnodeagent/sysctl.d/90-lbnodeagent-arp.conf; do
  grep -qx "$f" <<<"$files" || fail "the .rpm lacks $f"
done
[[ $(rpm -qp --configfiles "$rpm") == /etc/lbnodeagent/lbnodeagent.toml ]] || fail "the .rpm's config files are not just lbnodeagent.toml"
rpm -qp --qf '[%{FILENAMES} %{FILEFLAGS:fflags}\n]' "$rpm" | grep -qx '/etc/lbnodeagent/lbnodeagent.toml cn' ||
  fail "lbnodeagent.toml is not %config(noreplace)"
scripts=$(rpm -qp --scripts "$rpm")
for s in 'useradd --system' 'systemctl --no-reload enable lbnodeagent.service' \
  'systemctl try-restart lbnodeagent.service' 'disable --now lbnodeagent.service'; do
  grep -qF -- "$s" <<<"$scripts" || fail "the .rpm's scripts lack: $s"
done
ok "file list, %config(noreplace) and scripts"

log "rpm --root into the Debian root"
rpm --root "$root" --initdb
rpm --root "$root" -i --nodeps "$rpm"
mode_owner /usr/bin/lbnodeagent "755 root:root"
in_root getent passwd lbnodeagent >/dev/null || fail "the .rpm did not create the user"
[[ -L $link ]] || fail "the .rpm did not enable the unit"
echo 'namespace = "edited"' >>"$root/etc/lbnodeagent/lbnodeagent.toml"
rpm --root "$root" -e lbnodeagent
[[ ! -e $root/usr/bin/lbnodeagent ]] || fail "rpm -e left /usr/bin/lbnodeagent"
[[ -f $root/etc/lbnodeagent/lbnodeagent.toml.rpmsave ]] || fail "rpm -e did not keep the edited config as .rpmsave"
ok "installed (user, enabled), erased keeping the edited config as .rpmsave"

log "boot the root with systemd-nspawn: installed, not configured"
# The first release from the repository, which also holds the newer one:
# the second boot upgrades the running agent with apt-get upgrade.
apt_root install "lbnodeagent=$(dpkg-deb -f "$deb" Version)" >/dev/null || fail "apt-get install of the first release"
# A probe reports what the booted system made of the unit, then powers off.
cat >"$root/etc/systemd/system/lbnodeagent-probe.service" <<'UNIT'
[Unit]
After=lbnodeagent.service
[Service]
Type=oneshot
ExecStart=/bin/sh -c 'systemctl show lbnodeagent.service -p UnitFileState -p ActiveState -p ConditionResult >/probe.out; systemctl --no-block poweroff'
UNIT
ln -s ../lbnodeagent-probe.service "$root/etc/systemd/system/multi-user.target.wants/"
rm -f "$root/probe.out"
timeout 120 systemd-nspawn -q -b -D "$root" --register=no --keep-unit --console=pipe \
  </dev/null >"$work/boot.log" 2>&1 || true
if [[ -f $root/probe.out ]]; then
  cat "$root/probe.out"
  grep -qx UnitFileState=enabled "$root/probe.out" || fail "the booted system does not see the unit enabled"
  grep -qx ActiveState=inactive "$root/probe.out" || fail "the unconfigured unit did not stay inactive"
  grep -qx ConditionResult=no "$root/probe.out" || fail "the unit was not held back by ConditionPathExists"
  ok "booted: the unit is enabled and, without a kubeconfig, stays inactive instead of failing"
else
  echo "packaging test: NOT RUN: systemd-nspawn could not boot the Debian root on this host" \
    "(PID 1 is $(cat /proc/1/comm), /sys/fs/cgroup is $(stat -fc %T /sys/fs/cgroup)); its log:"
  tail -n 20 "$work/boot.log"
fi
if [[ -f $root/probe.out ]]; then
  log "boot again, configured: start (READY=1), reload, stop"
  # The container shares the host's network: the agent reaches a test API
  # server on the host's loopback, on ports of its own, with virtual mode
  # off and no Services, so it never changes an address.
  cargo build -q -p hostlb-tests --bin kube-testserver
  target/debug/kube-testserver --listen 127.0.0.1:16443 \
    --kubeconfig "$root/etc/lbnodeagent/kubeconfig" 2>"$work/apiserver.log" &
  apiserver=$!
  trap 'kill $apiserver 2>/dev/null || true' EXIT
  for _ in $(seq 50); do [[ -s $root/etc/lbnodeagent/kubeconfig ]] && break; sleep 0.1; done
  kubectl --kubeconfig "$root/etc/lbnodeagent/kubeconfig" apply -f deploy/crds/ >/dev/null
  cat >"$root/etc/lbnodeagent/lbnodeagent.toml" <<'TOML'
node_name = "pkgtest"
[gossip]
listen = "127.0.0.1:17934"
seeds = []
[announce]
virtual_interface = ""
[http]
listen = "127.0.0.1:17472"
TOML
  in_root lbnodeagent keygen --output /etc/lbnodeagent/gossip.key
  # For a start with the API server unreachable: the same config with a
  # kubeconfig whose server port has nothing behind it.
  sed 's/:16443/:16449/' "$root/etc/lbnodeagent/kubeconfig" >"$root/etc/lbnodeagent/down.kubeconfig"
  { echo 'kubeconfig = "/etc/lbnodeagent/down.kubeconfig"'; cat "$root/etc/lbnodeagent/lbnodeagent.toml"; } \
    >"$root/etc/lbnodeagent/down.toml"
  in_root chown lbnodeagent:lbnodeagent /etc/lbnodeagent/gossip.key /etc/lbnodeagent/kubeconfig \
    /etc/lbnodeagent/down.kubeconfig
  chmod 0600 "$root/etc/lbnodeagent/kubeconfig" "$root/etc/lbnodeagent/down.kubeconfig"
  cat >"$root/etc/systemd/system/lbnodeagent-probe.service" <<'UNIT'
[Unit]
After=lbnodeagent.service
[Service]
Type=oneshot
TimeoutStartSec=90
ExecStart=/bin/sh -c '\
  exec >/probe.out 2>&1; \
  systemctl start lbnodeagent.service; echo start=$$?; \
  systemctl show lbnodeagent.service -p ActiveState -p StatusText -p CPUWeight -p MemoryMax -p TasksMax; \
  pid=$$(systemctl show -p MainPID --value lbnodeagent.service); \
  systemctl reload lbnodeagent.service; echo reload=$$?; sleep 1; \
  [ "$$(systemctl show -p MainPID --value lbnodeagent.service)" = "$$pid" ] && echo same_pid=yes; \
  cp /etc/lbnodeagent/lbnodeagent.toml /root/good.toml; \
  echo "bogus_key = 1" >>/etc/lbnodeagent/lbnodeagent.toml; \
  systemctl reload lbnodeagent.service; echo bad_reload=$$?; \
  cp /root/good.toml /etc/lbnodeagent/lbnodeagent.toml; \
  [ "$$(systemctl show -p MainPID --value lbnodeagent.service)" = "$$pid" ] && echo bad_reload_same_pid=yes; \
  echo restart_warnings=$$(journalctl -u lbnodeagent.service --no-pager -o cat | grep -c "take effect only after a restart"); \
  DEBIAN_FRONTEND=noninteractive apt-get -q -y upgrade >/root/upgrade.log 2>&1; echo upgrade=$$?; \
  echo upgraded_to=$$(dpkg-query -W lbnodeagent | cut -f2); \
  newpid=$$(systemctl show -p MainPID --value lbnodeagent.service); \
  [ "$$newpid" != 0 ] && [ "$$newpid" != "$$pid" ] && echo upgrade_restarted=yes; \
  systemctl show lbnodeagent.service -p ActiveState | sed s/^/upgrade_/; \
  grep -q pkgtest /etc/lbnodeagent/lbnodeagent.toml && echo upgrade_config_kept=yes; \
  pid=$$newpid; \
  ms() { date +%%s%%3N; }; \
  kill -STOP $$pid; t0=$$(ms); \
  while [ -d /proc/$$pid ] && [ $$(( $$(ms) - t0 )) -lt 20000 ]; do sleep 0.02; done; \
  echo frozen_gone_ms=$$(( $$(ms) - t0 )); \
  while [ $$(( $$(ms) - t0 )) -lt 30000 ]; do \
    now=$$(systemctl show -p MainPID --value lbnodeagent.service); \
    [ "$$now" != 0 ] && [ "$$now" != "$$pid" ] && [ "$$(systemctl show -p ActiveState --value lbnodeagent.service)" = active ] && break; \
    sleep 0.02; \
  done; \
  echo frozen_restarted_ms=$$(( $$(ms) - t0 )); \
  echo frozen_cleanups=$$(journalctl -u lbnodeagent.service --no-pager -o cat | grep -c "removed .* addresses"); \
  systemctl show lbnodeagent.service -p NRestarts | sed s/^/frozen_/; \
  systemctl stop lbnodeagent.service; echo stop=$$?; \
  systemctl show lbnodeagent.service -p ActiveState -p Result -p ExecMainStatus; \
  journalctl -u lbnodeagent.service --no-pager -o cat; \
  cp /etc/lbnodeagent/down.toml /etc/lbnodeagent/lbnodeagent.toml; \
  t0=$$(date +%%s); systemctl start lbnodeagent.service; echo down_start=$$?; \
  echo down_took=$$(( $$(date +%%s) - t0 )); sleep 4; \
  systemctl show lbnodeagent.service -p ActiveState -p NRestarts -p StatusText | sed s/^/down_/; \
  systemctl stop lbnodeagent.service; echo down_stop=$$?; \
  systemctl --no-block poweroff'
UNIT
  rm -f "$root/probe.out"
  timeout 150 systemd-nspawn -q -b -D "$root" --register=no --keep-unit --console=pipe \
    </dev/null >"$work/boot2.log" 2>&1 || true
  kill $apiserver 2>/dev/null || true
  [[ -f $root/probe.out ]] || fail "the second boot wrote no probe output (see $work/boot2.log)"
  cat "$root/probe.out"
  for line in start=0 ActiveState=active CPUWeight=1000 MemoryMax=268435456 TasksMax=32 reload=0 same_pid=yes bad_reload_same_pid=yes restart_warnings=0 \
    upgrade=0 "upgraded_to=$(dpkg-deb -f "$upgrade" Version)" upgrade_restarted=yes upgrade_ActiveState=active \
    upgrade_config_kept=yes \
    stop=0 Result=success ExecMainStatus=0; do
    grep -qx "$line" "$root/probe.out" || fail "after boot: no '$line' (output above)"
  done
  # A bad file fails `systemctl reload` visibly; the running agent stays.
  grep -qx 'bad_reload=[1-9][0-9]*' "$root/probe.out" || fail "a reload with a bad file did not fail"
  ok "a reload with a bad file fails (systemctl says so) and the agent keeps running; an unchanged file reloads without warnings"
  grep -q 'removed .* addresses' "$root/probe.out" || fail "after boot: ExecStopPost cleanup did not run"
  # Frozen (SIGSTOP): the watchdog (WatchdogSec=3s) aborts it, the abort
  # times out into SIGKILL (TimeoutAbortSec=1s), cleanup runs as
  # ExecStopPost, and the unit restarts (RestartSec=2s).
  gone=$(sed -n 's/^frozen_gone_ms=//p' "$root/probe.out")
  restarted=$(sed -n 's/^frozen_restarted_ms=//p' "$root/probe.out")
  cleanups=$(sed -n 's/^frozen_cleanups=//p' "$root/probe.out")
  [[ -n $gone && $gone -le 6000 ]] || fail "frozen agent: still there ${gone:-?} ms after SIGSTOP"
  [[ -n $restarted && $restarted -lt 30000 ]] || fail "frozen agent: not restarted (${restarted:-?} ms)"
  grep -qx frozen_NRestarts=1 "$root/probe.out" || fail "frozen agent: not restarted once by systemd"
  [[ ${cleanups:-0} -ge 1 ]] || fail "frozen agent: cleanup did not run after the watchdog ended it"
  echo "frozen agent: ended ${gone} ms after SIGSTOP (cleanup ran), active again after ${restarted} ms"
  # Started while the API server is unreachable: a running, degraded
  # service (READY=1 at once, STATUS= says what it waits for), not a start
  # that times out and loops.
  for line in down_start=0 down_ActiveState=active down_NRestarts=0 down_stop=0; do
    grep -qx "$line" "$root/probe.out" || fail "API unreachable: no '$line' (output above)"
  done
  took=$(sed -n 's/^down_took=//p' "$root/probe.out")
  [[ -n $took && $took -le 5 ]] || fail "API unreachable: systemctl start took ${took:-?} s"
  grep -q '^down_StatusText=degraded: waiting for the API server (http://127.0.0.1:16449/)' "$root/probe.out" \
    || fail "API unreachable: STATUS= does not say what the agent waits for (output above)"
  # The sandbox must leave what the agent reads: the kernel release and
  # the hostname in /proc/sys.
  if grep -q 'cannot read' "$root/probe.out"; then
    fail "after boot: the agent could not read something under the unit's sandbox (output above)"
  fi
  ok "booted and configured: started (READY=1), reloaded in place, upgraded by apt-get upgrade from the repository (restarted, config kept), stopped cleanly, cleanup ran; started degraded without the API server"
else
  echo "packaging test: NOT RUN: starting the unit (READY=1, a reload, a clean stop): the root" \
    "could not be booted here (above)."
fi

echo "packaging test: ok"
