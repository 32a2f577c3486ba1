#!/usr/bin/env bash
# Builds Prometheus (server only, no web UI assets) from the Go module proxy into a cache keyed
# by version, for bench/dashboard_picture.py: the dashboard's own queries evaluated by a real
# Prometheus over the test bed's scrapes. Prints the binary's path.
set -euo pipefail
PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v0.316.0}"   # Prometheus 3.x's Go module version
CACHE="${CNIDRA_CACHE:-$HOME/.cache/cnidra}"
dir="$CACHE/prometheus-$PROMETHEUS_VERSION"
if [[ ! -f "$dir/.complete" ]]; then
  rm -rf "$dir.tmp"; mkdir -p "$dir.tmp"
  (cd "$(mktemp -d)" && GOBIN="$dir.tmp" CGO_ENABLED=0 GOFLAGS=-buildvcs=false \
    go install -trimpath -ldflags=-s \
    "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION" >&2)
  touch "$dir.tmp/.complete"
  rm -rf "$dir"; mv "$dir.tmp" "$dir"
fi
echo "$dir/prometheus"
