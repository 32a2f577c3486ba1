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
none of which a tenant can write)."""

from __future__ import annotations

import os
from pathlib import Path

from cnidra.util.files import write_atomically

WAIT_SECONDS = 20  # kubelet's CreateContainer call may take 2 minutes; retries come with backoff

SCRIPT = r"""#!/bin/sh
# cnidra's container gate (written by the driver: cnidra/state/gate.py). runc runs it as a
# createRuntime hook with the container's OCI state on stdin; it exits 0 once the pod's
# sandbox record says "added", and refuses the container otherwise.
records="$1"
wait="${2:-20}"
key='"io\.kubernetes\.cri\.sandbox-id" *: *"'
sandbox="$(sed -n "s/.*$key\([0-9A-Za-z_.-]*\)\".*/\1/p" | head -n 1)"
if [ -z "$sandbox" ]; then
  echo "cnidra: no sandbox ID in the container's annotations; refusing to start it" >&2
  exit 1
fi
tries=$((wait * 5))
while :; do
  if [ -f "$records/$sandbox.json" ] &&
    sed 's/"attachments".*//' "$records/$sandbox.json" | grep -q '"state":"added"'; then
    exit 0
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
