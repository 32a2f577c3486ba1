#!/usr/bin/env bash
# The single-node Kubernetes test bed: up | down | status | env | build. See docs/testbed.md.
cd "$(dirname "$0")/.." && exec python3 -m testbed "$@"
