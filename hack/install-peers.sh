#!/usr/bin/env bash
# Builds the peers cnidra is benchmarked against from the Go module proxy into a versioned
# cache, idempotently (`make bench` only; `make test` never needs them):
#   - Multus (thin plugin), what users run today for secondary networks
#   - dra-example-driver's kubelet plugin, a DRA driver that does nothing on the node: the
#     floor of kubelet's and the scheduler's DRA cost
#   - whereabouts, the cluster-wide IPAM plugin
# `hack/install-peers.sh env` prints where they are. A peer that cannot be built is reported
# by the benchmark with this script's error, never silently left out.
set -euo pipefail

MULTUS_VERSION="${MULTUS_VERSION:-v4.3.0}"
DRA_EXAMPLE_VERSION="${DRA_EXAMPLE_VERSION:-v0.4.0}"
WHEREABOUTS_VERSION="${WHEREABOUTS_VERSION:-v0.9.4}"
CACHE="${CNIDRA_CACHE:-$HOME/.cache/cnidra}"
MULTUS_DIR="$CACHE/multus-$MULTUS_VERSION"
DRA_EXAMPLE_DIR="$CACHE/dra-example-driver-$DRA_EXAMPLE_VERSION"
WHEREABOUTS_DIR="$CACHE/whereabouts-$WHEREABOUTS_VERSION"

env_lines() {
  echo "export CNIDRA_PEER_MULTUS=$MULTUS_DIR/multus"
  echo "export CNIDRA_PEER_DRA_EXAMPLE=$DRA_EXAMPLE_DIR/dra-example-kubeletplugin"
  echo "export CNIDRA_PEER_WHEREABOUTS=$WHEREABOUTS_DIR/whereabouts"
}

if [[ "${1:-}" == env ]]; then env_lines; exit 0; fi

export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

install() {  # install <dest-dir> <go install args...>
  local dest="$1"; shift
  [[ -f "$dest/.complete" ]] && return 0
  rm -rf "$dest.tmp"; mkdir -p "$dest.tmp"
  GOBIN="$dest.tmp" go install -trimpath -ldflags=-s "$@"
  touch "$dest.tmp/.complete"
  rm -rf "$dest"; mv "$dest.tmp" "$dest"
}

# whereabouts' go.mod has a replace line, which `go install pkg@version` refuses: a generated
# module requires it with the same replace and builds its main package
build_whereabouts() {
  local dest="$WHEREABOUTS_DIR"
  [[ -f "$dest/.complete" ]] && return 0
  local work; work="$(mktemp -d /tmp/cnidra-peers.XXXXXX)"
  trap 'rm -rf "$work"' RETURN
  rm -rf "$dest.tmp"; mkdir -p "$dest.tmp"
  (
    cd "$work"
    go mod init cnidra.local/peers >/dev/null 2>&1
    go mod edit -replace github.com/gogo/protobuf=github.com/gogo/protobuf@v1.3.2
    go get "github.com/k8snetworkplumbingwg/whereabouts/cmd@$WHEREABOUTS_VERSION" 2>/dev/null
    go build -trimpath -ldflags=-s -o "$dest.tmp/whereabouts" \
      github.com/k8snetworkplumbingwg/whereabouts/cmd
  )
  touch "$dest.tmp/.complete"
  rm -rf "$dest"; mv "$dest.tmp" "$dest"
}

install "$MULTUS_DIR" "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus@$MULTUS_VERSION"
install "$DRA_EXAMPLE_DIR" \
  "sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin@$DRA_EXAMPLE_VERSION"
build_whereabouts
