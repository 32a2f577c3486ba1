#!/usr/bin/env bash
# Installs the CNI reference plugins and cnitool into a versioned cache, idempotently.
#   - Debian's containernetworking-plugins (1.1.1: no STATUS/GC) under /usr/lib/cni
#   - the newest plugins release, built with `go install` from the Go module proxy
#   - cnitool from github.com/containernetworking/cni
# Prints nothing but errors unless -v; the resulting dirs are printed by `hack/install-cni.sh env`.
set -euo pipefail

CNI_PLUGINS_VERSION="${CNI_PLUGINS_VERSION:-v1.9.1}"
CNI_VERSION="${CNI_VERSION:-v1.3.1}"
CACHE="${CNIDRA_CACHE:-$HOME/.cache/cnidra}"
PLUGINS_DIR="$CACHE/cni-plugins-$CNI_PLUGINS_VERSION"
CNITOOL_DIR="$CACHE/cnitool-$CNI_VERSION"

env_lines() {
  echo "export CNIDRA_TEST_CNI_PATH=$PLUGINS_DIR"
  echo "export CNIDRA_TEST_DEBIAN_CNI_PATH=/usr/lib/cni"
  echo "export CNIDRA_TEST_CNITOOL=$CNITOOL_DIR/cnitool"
}

if [[ "${1:-}" == env ]]; then env_lines; exit 0; fi

if [[ ! -x /usr/lib/cni/bridge ]]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q containernetworking-plugins >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q containernetworking-plugins >/dev/null; }
fi

build() {  # build <dest-dir> <go install args...>
  local dest="$1"; shift
  [[ -f "$dest/.complete" ]] && return 0
  rm -rf "$dest.tmp"; mkdir -p "$dest.tmp"
  GOBIN="$dest.tmp" CGO_ENABLED=0 GOFLAGS=-buildvcs=false go install -trimpath -ldflags=-s "$@"
  touch "$dest.tmp/.complete"
  rm -rf "$dest"; mv "$dest.tmp" "$dest"
}

build "$PLUGINS_DIR" \
  "github.com/containernetworking/plugins/plugins/main/...@$CNI_PLUGINS_VERSION" \
  "github.com/containernetworking/plugins/plugins/ipam/...@$CNI_PLUGINS_VERSION" \
  "github.com/containernetworking/plugins/plugins/meta/...@$CNI_PLUGINS_VERSION"
build "$CNITOOL_DIR" "github.com/containernetworking/cni/cnitool@$CNI_VERSION"
