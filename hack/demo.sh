#!/usr/bin/env bash
# The main job on one machine: validate the examples, convert an existing CNI file, and `cnidra try`
# the seed's macvlan claim in a throwaway node namespace (nothing on the host is touched).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
eval "$(hack/install-cni.sh env)"
export CNIDRA_CNI_PATH="$CNIDRA_TEST_CNI_PATH"

step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }

step cnidra validate --policy deploy/deviceclass.yaml examples/*.yaml
$BIN/cnidra validate --policy deploy/deviceclass.yaml examples/*.yaml

step cnidra validate --policy deploy/deviceclass.yaml examples/invalid/design-review.yaml
$BIN/cnidra validate --policy deploy/deviceclass.yaml examples/invalid/design-review.yaml ||
  echo "(exit $?: every mistake found, each named with its field)"

step cnidra convert examples/convert/macvlan-nad.yaml
$BIN/cnidra convert examples/convert/macvlan-nad.yaml

step cnidra try --policy deploy/deviceclass.yaml examples/macvlan-claim.yaml
$BIN/cnidra try --policy deploy/deviceclass.yaml examples/macvlan-claim.yaml

step cnidra try --policy deploy/deviceclass.yaml examples/two-networks-claim.yaml -o json
$BIN/cnidra try --policy deploy/deviceclass.yaml examples/two-networks-claim.yaml -o json

step cnidra try examples/invalid/failing-ipam.yaml
$BIN/cnidra try examples/invalid/failing-ipam.yaml || echo "(exit $?: the ADD failed, was rolled back, and nothing is left)"
