#!/usr/bin/env bash
# The main job on one machine: check the examples, convert an existing CNI file.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
echo "### cnidra validate examples/*.yaml"
$BIN/cnidra validate examples/*.yaml
echo
echo "### cnidra validate examples/invalid/design-review.yaml (three mistakes, exit 1)"
$BIN/cnidra validate examples/invalid/design-review.yaml || true
echo
echo "### cnidra convert examples/convert/macvlan-nad.yaml"
$BIN/cnidra convert examples/convert/macvlan-nad.yaml
