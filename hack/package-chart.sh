#!/usr/bin/env bash
# Packages charts/cnidra as dist/cnidra-<version>.tgz (what `helm install` and a chart
# repository take), linted first. Called by `make image`; prints the package's path.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-dist}"; mkdir -p "$OUT"
helm="$(hack/install-helm.sh)"
"$helm" lint --strict charts/cnidra >&2
"$helm" package charts/cnidra --destination "$OUT" | sed -n 's/^Successfully packaged chart and saved it to: //p'
