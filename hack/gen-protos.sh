#!/usr/bin/env bash
# Generates the Python (and typing stub) modules for cnidra's .proto files, next to them.
# The generated files are build output: ignored by git, never edited by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
export PATH="$(dirname "$PY"):$PATH"  # protoc-gen-mypy lives beside the interpreter
mapfile -t protos < <(find cnidra/_proto -name '*.proto' | sort)
"$PY" -m grpc_tools.protoc -I . --python_out=. --grpc_python_out=. --mypy_out=. \
  --mypy_grpc_out=. "${protos[@]}"
