#!/usr/bin/env bash
# Builds (or adds to) a signed package repository that any web server can
# serve: an apt repository and a dnf repository side by side.
#
#   packaging/repo.sh --key KEY --out DIR [PACKAGE...]
#
# KEY is a secret key in the caller's GnuPG keyring (GNUPGHOME): a key id,
# fingerprint or user id. PACKAGEs (.deb and .rpm) default to what
# packaging/build.sh left in target/packages. Packages already in DIR stay,
# so a newer build is added beside the older one and `apt-get upgrade` or
# `dnf upgrade` finds it. DIR then holds:
#
#   hostlb.asc, hostlb.gpg          the public key, armored and binary
#   apt/pool/main/*.deb
#   apt/dists/stable/{InRelease,Release,Release.gpg}, main/binary-*/Packages*
#   rpm/*.rpm                        each signed (rpmsign)
#   rpm/repodata/repomd.xml{,.asc}   createrepo_c's metadata, signed
#   hostlb.repo                      a dnf repo file to adapt (baseurl)
#
# Needs gpg, apt-ftparchive (apt-utils), createrepo_c (createrepo-c) and
# rpmsign (rpm); on Debian it installs what is missing. The client side is
# in packaging/README.md ("A signed repository").
set -euo pipefail

usage() {
  sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

key="" out=""
packages=()
while (($#)); do
  case $1 in
    --key) key=${2:-}; shift 2 || usage ;;
    --out) out=${2:-}; shift 2 || usage ;;
    -h | --help) usage ;;
    -*) echo "repo.sh: unknown option $1" >&2; usage ;;
    *) packages+=("$1"); shift ;;
  esac
done
[[ -n $key && -n $out ]] || usage
if ((${#packages[@]} == 0)); then
  shopt -s nullglob
  packages=("$(dirname "$0")"/../target/packages/*.deb "$(dirname "$0")"/../target/packages/*.rpm)
  shopt -u nullglob
fi
((${#packages[@]})) || { echo "repo.sh: no packages given and none in target/packages (run packaging/build.sh)" >&2; exit 1; }

missing=()
command -v gpg >/dev/null || missing+=(gnupg)
command -v apt-ftparchive >/dev/null || missing+=(apt-utils)
command -v createrepo_c >/dev/null || missing+=(createrepo-c)
command -v rpmsign >/dev/null || missing+=(rpm)
if ((${#missing[@]})); then
  command -v apt-get >/dev/null || { echo "repo.sh: needs ${missing[*]}" >&2; exit 1; }
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

# gpg runs from inside DIR below: a relative keyring path must not move.
[[ -z ${GNUPGHOME:-} ]] || export GNUPGHOME=$(realpath "$GNUPGHOME")
# The signing key must be there and usable before anything is written.
fingerprint=$(gpg --batch --with-colons --list-secret-keys "$key" 2>/dev/null | awk -F: '$1 == "fpr" { print $10; exit }')
[[ -n $fingerprint ]] || { echo "repo.sh: no secret key '$key' in the GnuPG keyring (GNUPGHOME=${GNUPGHOME:-~/.gnupg})" >&2; exit 1; }
sign() { gpg --batch --yes --pinentry-mode loopback --local-user "$fingerprint" "$@"; }

mkdir -p "$out/apt/pool/main" "$out/rpm"
out=$(realpath "$out")
for p in "${packages[@]}"; do
  case $p in
    *.deb) cp -f "$p" "$out/apt/pool/main/" ;;
    *.rpm)
      cp -f "$p" "$out/rpm/"
      if ! msg=$(rpmsign --addsign --define "_gpg_name $fingerprint" --define "__gpg $(command -v gpg)" \
        --define "_gpg_sign_cmd_extra_args --batch --pinentry-mode loopback" \
        "$out/rpm/$(basename "$p")" 2>&1); then
        echo "$msg" >&2
        echo "repo.sh: rpmsign failed for $(basename "$p")" >&2
        exit 1
      fi
      ;;
    *) echo "repo.sh: $p is neither a .deb nor an .rpm" >&2; exit 1 ;;
  esac
done

gpg --batch --yes --armor --export "$fingerprint" >"$out/hostlb.asc"
gpg --batch --yes --export "$fingerprint" >"$out/hostlb.gpg"

# apt: one suite, "stable", one component, "main"; every architecture the
# pool holds packages for.
(
  cd "$out/apt"
  archs=$(for d in pool/main/*.deb; do dpkg-deb -f "$d" Architecture; done | sort -u | tr '\n' ' ')
  rm -rf dists
  for arch in $archs; do
    dir=dists/stable/main/binary-$arch
    mkdir -p "$dir"
    apt-ftparchive --arch "$arch" packages pool/main >"$dir/Packages"
    gzip -9nkf "$dir/Packages"
  done
  apt-ftparchive \
    -o APT::FTPArchive::Release::Origin=hostlb \
    -o APT::FTPArchive::Release::Label=hostlb \
    -o APT::FTPArchive::Release::Suite=stable \
    -o APT::FTPArchive::Release::Codename=stable \
    -o "APT::FTPArchive::Release::Architectures=${archs% }" \
    -o APT::FTPArchive::Release::Components=main \
    -o APT::FTPArchive::Release::Description="hostlb packages" \
    release dists/stable >Release.tmp
  mv Release.tmp dists/stable/Release
  sign --clearsign -o dists/stable/InRelease dists/stable/Release
  sign --armor --detach-sign -o dists/stable/Release.gpg dists/stable/Release
)

# dnf: createrepo_c's metadata and its detached signature, which dnf checks
# with repo_gpgcheck=1.
(
  cd "$out/rpm"
  createrepo_c --quiet --update .
  sign --armor --detach-sign -o repodata/repomd.xml.asc repodata/repomd.xml
)
cat >"$out/hostlb.repo" <<'REPO'
[hostlb]
name=hostlb
baseurl=https://packages.example.com/hostlb/rpm
enabled=1
gpgcheck=1
repo_gpgcheck=1
gpgkey=https://packages.example.com/hostlb/hostlb.asc
REPO

echo "repository in $out, signed by $fingerprint:"
find "$out" -type f \( -name '*.deb' -o -name '*.rpm' \) -printf '  %P\n' | sort
