#!/usr/bin/env bash
# The single-node Kubernetes test bed: up | down | status | env | build. See docs/testbed.md.
exec python3 "$(dirname "$0")/testbed/testbed.py" "$@"
