#!/usr/bin/env bash
# Builds the allocator's OCI image without Docker and without pulling any
# base image: target/packages/allocator-<version>.oci.tar, an OCI image
# layout in a tar (load it with `podman load -i`, push it with `skopeo copy
# oci-archive:target/packages/allocator-<version>.oci.tar
# docker://REGISTRY/hostlb/allocator:<version>`).
#
# The one layer holds the allocator built for glibc 2.28 (the binary the
# packages' build makes, through packaging/zigbuild.sh), the shared
# libraries it links (from this build host's Debian packages), the CA
# certificates, and /etc/passwd and /etc/group naming the non-root user
# 65532 it runs as. Nothing else: no shell, no package manager.
#
# Reproducible: every file and the archive carry SOURCE_DATE_EPOCH (the
# last commit's time unless set), owner 0, sorted names and no gzip time,
# so the same binary and host packages give the same digest, which is
# printed. The labels name the libc6 and ca-certificates versions it took.
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
: "${SOURCE_DATE_EPOCH:=$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
export SOURCE_DATE_EPOCH
out=target/packages/allocator-$version.oci.tar
bin=target/x86_64-unknown-linux-gnu/release/allocator

[[ -f /etc/ssl/certs/ca-certificates.crt ]] || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ca-certificates
}
if [[ ${IMAGE_NO_BUILD:-} != 1 ]]; then
  # The one release build (see zigbuild.sh): nothing to do after
  # packaging/build.sh.
  printf '\n== packaging/zigbuild.sh\n'
  packaging/zigbuild.sh
fi

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
install -D -m 0755 "$bin" "$root/allocator"
# The libraries the dynamic linker loads, at the paths it looks for them.
ldd "$bin" | awk '/=> \// {print $3} /^[[:space:]]*\/.*ld-linux/ {print $1}' | while read -r lib; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
mkdir -p "$root/etc" "$root/tmp" "$root/home/nonroot"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
libc=$(dpkg-query -W -f '${Version}' libc6 2>/dev/null || echo unknown)
certs=$(dpkg-query -W -f '${Version}' ca-certificates 2>/dev/null || echo unknown)

mkdir -p target/packages
python3 - "$root" "$out" "$version" "$libc" "$certs" <<'PY'
import gzip, hashlib, io, json, os, sys, tarfile, time

root, out, version, libc, certs = sys.argv[1:]
epoch = int(os.environ["SOURCE_DATE_EPOCH"])

def entry(name, data=None, mode=0o644, kind=tarfile.REGTYPE, uid=0):
    info = tarfile.TarInfo(name)
    info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, uid, uid, "", ""
    info.mode, info.type = mode, kind
    if data is not None:
        info.size = len(data)
    return info

# The layer: every file under root, sorted, owner 0 (the user's home and
# /tmp excepted), times set to the epoch.
layer = io.BytesIO()
with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as t:
    paths = []
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            paths.append(os.path.relpath(os.path.join(d, n), root))
    for p in sorted(paths):
        full = os.path.join(root, p)
        if os.path.isdir(full):
            mode, uid = (0o1777, 0) if p == "tmp" else (0o755, 65532 if p == "home/nonroot" else 0)
            t.addfile(entry(p, mode=mode, kind=tarfile.DIRTYPE, uid=uid))
        else:
            data = open(full, "rb").read()
            mode = 0o755 if os.access(full, os.X_OK) else 0o644
            t.addfile(entry(p, data, mode), io.BytesIO(data))
raw = layer.getvalue()
diff_id = "sha256:" + hashlib.sha256(raw).hexdigest()
gz = io.BytesIO()
with gzip.GzipFile(fileobj=gz, mode="wb", compresslevel=9, mtime=0, filename="") as g:
    g.write(raw)
layer_gz = gz.getvalue()

blobs = {}
def blob(data):
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"digest": digest, "size": len(data)}

created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
labels = {
    "org.opencontainers.image.title": "hostlb allocator",
    "org.opencontainers.image.version": version,
    "org.opencontainers.image.created": created,
    "io.hostlb.base.libc6": libc,
    "io.hostlb.base.ca-certificates": certs,
}
config = {
    "created": created,
    "architecture": "amd64",
    "os": "linux",
    "config": {
        "User": "65532:65532",
        "Entrypoint": ["/allocator"],
        "Cmd": ["run"],
        "Env": ["SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"],
        "ExposedPorts": {"7472/tcp": {}},
        "WorkingDir": "/",
        "Labels": labels,
    },
    "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    "history": [{"created": created, "created_by": "packaging/image.sh"}],
}
dump = lambda v: json.dumps(v, sort_keys=True, separators=(",", ":")).encode()
manifest = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **blob(dump(config))},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **blob(layer_gz)}],
    "annotations": labels,
}
m = blob(dump(manifest))
index = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.index.v1+json",
    "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", **m,
        "annotations": {"org.opencontainers.image.ref.name": version},
    }],
}
with tarfile.open(out + ".tmp", mode="w", format=tarfile.PAX_FORMAT) as t:
    files = {"oci-layout": dump({"imageLayoutVersion": "1.0.0"}), "index.json": dump(index)}
    for digest, data in blobs.items():
        files["blobs/sha256/" + digest.split(":")[1]] = data
    for d in ["blobs", "blobs/sha256"]:
        t.addfile(entry(d, mode=0o755, kind=tarfile.DIRTYPE))
    for name in sorted(files):
        t.addfile(entry(name, files[name]), io.BytesIO(files[name]))
os.replace(out + ".tmp", out)
print(f"{out}: manifest {m['digest']}, {len(layer_gz)} bytes compressed")
PY
