#!/usr/bin/env bash
# Builds helm from the Go module proxy into a cache keyed by version (like the test bed's
# binaries), for `helm lint`/`helm template` in the tests and `make deploy`. Prints its path.
set -euo pipefail
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
CACHE="${CNIDRA_CACHE:-$HOME/.cache/cnidra}"
dir="$CACHE/helm-$HELM_VERSION"
if [[ ! -f "$dir/.complete" ]]; then
  rm -rf "$dir.tmp"; mkdir -p "$dir.tmp"
  (cd "$(mktemp -d)" && GOBIN="$dir.tmp" CGO_ENABLED=0 GOFLAGS=-buildvcs=false \
    go install -trimpath -ldflags=-s "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2)
  touch "$dir.tmp/.complete"
  rm -rf "$dir"; mv "$dir.tmp" "$dir"
fi
echo "$dir/helm"
