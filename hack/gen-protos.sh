#!/usr/bin/env bash
# Generates the Python message (and typing stub) modules for cnidra's .proto files, next to them.
# The generated files are build output: ignored by git, never edited by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
export PATH="$(dirname "$PY"):$PATH"  # protoc-gen-mypy lives beside the interpreter
mapfile -t protos < <(find cnidra/_proto -name '*.proto' | sort)
# messages only: the services are served and called through grpclib (cnidra/util/rpc.py), their
# methods listed by hand
"$PY" -m grpc_tools.protoc -I . --python_out=. --mypy_out=. "${protos[@]}"
