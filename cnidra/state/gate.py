"""The container gate: the second lock between a pod's containers and the runtime, besides the
NRI hook. containerd drops an NRI plugin that does not answer in time and goes on creating
containers, so NRI alone cannot promise that no container starts before its pod's interfaces
are attached. The gate can: every cnidra claim's CDI device carries it as a `createRuntime`
OCI hook, which runc runs on the node before the container's process exists, and a hook that
fails fails the container's creation (kubelet tries again, with the hook's message in the pod's
events).

The gate passes once the pod's sandbox record (<state>/sandboxes/<sandbox id>.json, written by
the NRI hook) says `added`: every interface the pod gets at start is attached. It waits for
that at most WAIT_SECONDS, then refuses. It is a POSIX shell script (every node has /bin/sh;
the hook runs in the node's namespaces, not the driver's image) that the driver writes into
its state root at start; it reads the record's head only (the fields before `attachments`,
none of which a tenant can write), which the sandbox store writes alone on the record's first
line. It forks nothing on the way through (shell builtins only): about 1.1 ms of CPU a
container against 5.3 ms for the sed and grep it ran before."""

from __future__ import annotations

import os
from pathlib import Path

from cnidra.util.files import write_atomically

WAIT_SECONDS = 20  # kubelet's CreateContainer call may take 2 minutes; retries come with backoff

SCRIPT = r"""#!/bin/sh
# cnidra's container gate (written by the driver: cnidra/state/gate.py). runc runs it as a
# createRuntime hook with the container's OCI state on stdin; it exits 0 once the pod's
# sandbox record says "added", and refuses the container otherwise. Shell builtins only: it
# runs for every container of every pod with a claim, and a fork costs more than the rest.
records="$1"
wait="${2:-20}"
IFS= read -r state || [ -n "$state" ]
# the state is JSON on one line: split it at every quote, and the field after the key
# (with only a colon and blanks between) is the sandbox ID
sandbox=""
set -f
IFS='"'
# shellcheck disable=SC2086
set -- $state
unset IFS
while [ "$#" -gt 2 ]; do
  if [ "$1" = "io.kubernetes.cri.sandbox-id" ]; then
    case "$2" in
    *[!\ \	:]*) ;;
    *) sandbox="$3"; break ;;
    esac
  fi
  shift
done
case "$sandbox" in
"" | .* | *[!0-9A-Za-z_.-]*)
  echo "cnidra: no sandbox ID in the container's annotations; refusing to start it" >&2
  exit 1
  ;;
esac
tries=$((wait * 5))
while :; do
  # the record's first line is its head (every field but the attachments, none of which a
  # tenant writes); a record written before that layout is one line, cut at the attachments
  head=""
  if [ -f "$records/$sandbox.json" ] &&
    { IFS= read -r head <"$records/$sandbox.json" || [ -n "$head" ]; }; then
    case "${head%%\"attachments\"*}" in *'"state":"added"'*) exit 0 ;; esac
  fi
  tries=$((tries - 1))
  [ "$tries" -gt 0 ] || break
  sleep 0.2
done
echo "cnidra: the pod's secondary interfaces are not attached (sandbox $sandbox," \
  "waited ${wait}s); the container starts once they are (is cnidra's driver running?)" >&2
exit 1
"""


def install(path: Path) -> None:
    """Write the script (again at every start: an upgrade changes it), executable by root."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    write_atomically(path, SCRIPT.encode(), mode=0o755)
    os.chmod(path, 0o755)


def hook_args(host_path: Path, records: Path, wait: int = WAIT_SECONDS) -> list[str]:
    """The hook's argv as the runtime runs it: paths as the node sees them."""
    return [str(host_path), str(records), str(wait)]
