#!/usr/bin/env bash
# `make image`: the driver's (and webhook's) OCI image, built here without Docker or a registry.
#   base layer: Debian bookworm essential packages + python3, libstdc++6 (protobuf's upb and frozenlist link it) and nftables
#               (network policy runs `nft` in the pods' namespaces) (mmdebstrap, reproducible with
#               SOURCE_DATE_EPOCH), shells and apt removed;
#   app layer:  the cnidra wheel and its dependencies (binary wheels for CPython 3.11 from
#               PyPI) under /opt/cnidra, and /usr/local/bin/cnidra.
#   plugins layer (CNI_PLUGINS=1 only): the CNI reference plugins (built from the Go module
#               proxy by hack/install-cni.sh, cached) under /opt/cnidra/cni-plugins, which the
#               chart's `cniPlugins.install` init step copies onto the node.
# Writes dist/cnidra-image.tar (OCI archive, reference cnidra:$VERSION; with CNI_PLUGINS=1
# dist/cnidra-image-cni-plugins.tar, cnidra:$VERSION-cni-plugins; with CNI_PLUGINS=both the two
# from one build) and prints its digest (each's, the plain one first).
# Same commit, same digest (the Debian mirror's state aside: the package versions are listed in
# dist/cnidra-image.packages).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-.venv/bin/python}"
VERSION="$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])')"
# CNI_PLUGINS: 0 the plain image, 1 the one with the plugins, both: the two from one build
# (one base and app layer; the plain digest printed first)
WANT="${CNI_PLUGINS:-0}"
case "$WANT" in 0|1|both) ;; *) echo "CNI_PLUGINS must be 0, 1 or both, not '$WANT'" >&2; exit 2;; esac
if [ "$WANT" = both ] && [ -n "${IMAGE_REF:-}" ]; then
  echo "IMAGE_REF names one image; CNI_PLUGINS=both makes two" >&2; exit 2
fi
EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
export SOURCE_DATE_EPOCH="$EPOCH"
OUT=dist; mkdir -p "$OUT"
work=/tmp/cnidra-image-build; rm -rf "$work"; mkdir -p "$work/app/opt/cnidra" "$work/app/usr/local/bin"
trap 'rm -rf "$work"' EXIT
command -v mmdebstrap >/dev/null || {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q mmdebstrap >/dev/null 2>&1 ||
  { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q mmdebstrap >/dev/null; }
}
mmdebstrap --quiet --variant=essential --include=python3,libstdc++6,nftables \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  bookworm "$work/base.tar"
tar -xOf "$work/base.tar" ./var/lib/dpkg/status | awk '/^Package:/{p=$2} /^Version:/{print p, $2}' \
  > "$work/packages"
# one build in this source tree at a time (its build/ and egg-info directories): the unit
# tests' wheel and sdist (tests/test_packaging.py) may be building beside this
mkdir -p dist
flock dist/.build.lock "$PY" -m build --wheel --outdir "$work/wheel" . >/dev/null
# binary wheels for the image's Python, installed without bytecode (pyc embed mtimes)
"$PY" -m pip install -q --no-compile --target "$work/app/opt/cnidra" \
  --python-version 3.11 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --only-binary=:all: --implementation cp "$work"/wheel/cnidra-*.whl
find "$work/app/opt/cnidra" -name direct_url.json -delete   # it names this build's temp path
rm -rf "$work/app/opt/cnidra/bin"                            # scripts with this host's shebang
printf '#!/usr/bin/python3\nfrom cnidra.cli.main import main\nmain()\n' \
  > "$work/app/usr/local/bin/cnidra"
chmod 0755 "$work/app/usr/local/bin/cnidra"
tar -C "$work/app" -cf "$work/app.tar" .
layers=(--layer "$work/base.tar" --layer "$work/app.tar")
# NAME TAG LAYER...: the archive dist/NAME.tar, referenced as cnidra:TAG (what kubelet resolves
# cnidra:TAG to) unless IMAGE_REF says; prints its digest
emit() {
  local name="$1" tag="$2"; shift 2
  cp "$work/packages" "$OUT/$name.packages"
  "$PY" -m testbed.oci "$OUT/$name.tar" "${IMAGE_REF:-docker.io/library/cnidra:$tag}" "$@" \
    --epoch "$EPOCH" \
    --drop usr/bin/sh --drop usr/bin/bash --drop usr/bin/rbash --drop usr/bin/dash \
    --drop usr/bin/apt --drop usr/bin/apt-get --drop usr/lib/apt --drop var/lib/apt --drop etc/apt \
    --config '{"Entrypoint": ["/usr/local/bin/cnidra"], "Env": ["PATH=/usr/local/bin:/usr/bin:/usr/sbin:/bin:/sbin", "PYTHONPATH=/opt/cnidra", "PYTHONDONTWRITEBYTECODE=1"], "WorkingDir": "/", "Labels": {"org.opencontainers.image.source": "cnidra"}}'
}
if [ "$WANT" != 1 ]; then emit cnidra-image "$VERSION" "${layers[@]}"; fi
if [ "$WANT" != 0 ]; then
  plugins="$(hack/install-cni.sh env | sed -n 's/^export CNIDRA_TEST_CNI_PATH=//p')"
  hack/install-cni.sh >/dev/null
  mkdir -p "$work/plugins/opt/cnidra/cni-plugins"
  cp "$plugins"/* "$work/plugins/opt/cnidra/cni-plugins/"
  tar -C "$work/plugins" -cf "$work/plugins.tar" .
  emit cnidra-image-cni-plugins "$VERSION-cni-plugins" "${layers[@]}" --layer "$work/plugins.tar"
fi
