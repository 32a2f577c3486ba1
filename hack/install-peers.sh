#!/usr/bin/env bash
# Builds the peers cnidra is benchmarked against from the Go module proxy into a versioned
# cache, idempotently (`make bench` only; `make test` never needs them):
#   - Multus (thin plugin), what users run today for secondary networks
#   - Multus thick: its shim (the runtime's CNI plugin, which only forwards the call over a
#     unix socket) and its daemon (which reads the pod and its NADs and execs the delegates),
#     the deployment Multus' own docs now recommend
#   - dra-example-driver's kubelet plugin, a DRA driver that does nothing on the node: the
#     floor of kubelet's and the scheduler's DRA cost
#   - whereabouts, the cluster-wide IPAM plugin
# `hack/install-peers.sh env` prints where they are; `hack/install-peers.sh multus whereabouts`
# builds only those (the Multus migration test on the test bed needs no more). A peer that
# cannot be built is reported by the benchmark with this script's error, never silently left out.
set -euo pipefail

MULTUS_VERSION="${MULTUS_VERSION:-v4.3.0}"
DRA_EXAMPLE_VERSION="${DRA_EXAMPLE_VERSION:-v0.4.0}"
WHEREABOUTS_VERSION="${WHEREABOUTS_VERSION:-v0.9.4}"
CACHE="${CNIDRA_CACHE:-$HOME/.cache/cnidra}"
MULTUS_DIR="$CACHE/multus-$MULTUS_VERSION"
MULTUS_SHIM_DIR="$CACHE/multus-shim-$MULTUS_VERSION"
MULTUS_DAEMON_DIR="$CACHE/multus-daemon-$MULTUS_VERSION"
DRA_EXAMPLE_DIR="$CACHE/dra-example-driver-$DRA_EXAMPLE_VERSION"
WHEREABOUTS_DIR="$CACHE/whereabouts-$WHEREABOUTS_VERSION"

env_lines() {
  echo "export CNIDRA_PEER_MULTUS=$MULTUS_DIR/multus"
  echo "export CNIDRA_PEER_MULTUS_SHIM=$MULTUS_SHIM_DIR/multus-shim"
  echo "export CNIDRA_PEER_MULTUS_DAEMON=$MULTUS_DAEMON_DIR/multus-daemon"
  echo "export CNIDRA_PEER_DRA_EXAMPLE=$DRA_EXAMPLE_DIR/dra-example-kubeletplugin"
  echo "export CNIDRA_PEER_WHEREABOUTS=$WHEREABOUTS_DIR/whereabouts"
}

if [[ "${1:-}" == env ]]; then env_lines; exit 0; fi
WANT=" ${*:-multus multus-thick dra-example whereabouts} "
wanted() { [[ "$WANT" == *" $1 "* ]]; }

export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

# A generated module that requires the peer at its version (with the peer's own replace lines)
# builds its main package: `go install pkg@version` would read the module's version list, which
# the proxy refuses (403) for these modules although it serves the versions themselves.
build() {  # build <dest-dir> <binary> <module> <version> <package> [replace...]
  local dest="$1" binary="$2" module="$3" version="$4" package="$5"; shift 5
  [[ -f "$dest/.complete" ]] && return 0
  local work; work="$(mktemp -d /tmp/cnidra-peers.XXXXXX)"
  rm -rf "$dest.tmp"; mkdir -p "$dest.tmp"
  (
    cd "$work"
    go mod init cnidra.local/peers >/dev/null 2>&1
    go mod edit -require "$module@$version"
    for r in "$@"; do go mod edit -replace "$r"; done
    go mod download "$module@$version"
    GOFLAGS="$GOFLAGS -mod=mod" \
      go build -trimpath -ldflags=-s -o "$dest.tmp/$binary" "$package"
  )
  rm -rf "$work"
  touch "$dest.tmp/.complete"
  rm -rf "$dest"; mv "$dest.tmp" "$dest"
}

wanted multus && build "$MULTUS_DIR" multus gopkg.in/k8snetworkplumbingwg/multus-cni.v4 "$MULTUS_VERSION" \
  gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus
# thick: two binaries of the same module and version, a directory each (a directory is one build)
wanted multus-thick && build "$MULTUS_SHIM_DIR" multus-shim gopkg.in/k8snetworkplumbingwg/multus-cni.v4 \
  "$MULTUS_VERSION" gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-shim
wanted multus-thick && build "$MULTUS_DAEMON_DIR" multus-daemon gopkg.in/k8snetworkplumbingwg/multus-cni.v4 \
  "$MULTUS_VERSION" gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-daemon
wanted dra-example && build "$DRA_EXAMPLE_DIR" dra-example-kubeletplugin sigs.k8s.io/dra-example-driver \
  "$DRA_EXAMPLE_VERSION" sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin
wanted whereabouts && build "$WHEREABOUTS_DIR" whereabouts github.com/k8snetworkplumbingwg/whereabouts \
  "$WHEREABOUTS_VERSION" github.com/k8snetworkplumbingwg/whereabouts/cmd \
  github.com/gogo/protobuf=github.com/gogo/protobuf@v1.3.2
# whereabouts' CRDs (IPPool, OverlappingRangeIPReservation), as its release ships them, for
# bench.ipam to install
if wanted whereabouts && [[ ! -f "$WHEREABOUTS_DIR/crds/.complete" ]]; then
  src="$(go env GOMODCACHE)/github.com/k8snetworkplumbingwg/whereabouts@$WHEREABOUTS_VERSION"
  [[ -d "$src" ]] || (cd "$(mktemp -d)" && go mod download "github.com/k8snetworkplumbingwg/whereabouts@$WHEREABOUTS_VERSION")
  mkdir -p "$WHEREABOUTS_DIR/crds"
  cp "$src"/doc/crds/whereabouts.cni.cncf.io_*.yaml "$WHEREABOUTS_DIR/crds/"
  chmod u+w "$WHEREABOUTS_DIR/crds/"*.yaml
  touch "$WHEREABOUTS_DIR/crds/.complete"
fi
