"""The container gate's CPU a container: the script the driver writes (cnidra/state/gate.py),
run as runc runs a createRuntime hook (the container's OCI state on stdin) against a record the
real sandbox store wrote, `--runs` times; its CPU with every process it starts (this process's
reaped children), against `/bin/sh` doing nothing (what any hook costs) and against the gate
that ran `sed`, `head` and `grep` before it (kept here, as it was, to compare with).

    python -m bench.gate [--runs N] [--json]

The state carries 15 annotations besides the sandbox ID (about 1.3 KB, a pod's usual), the
record one attachment with a 2 KB config. The last line printed is one JSON object:
cpu_ms_per_container for `gate`, `before` and `nothing`, and `gate_beyond_nothing_ms`."""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import tempfile
from pathlib import Path

from cnidra.api.refs import ObjectRef
from cnidra.cni.attach import Attachment
from cnidra.state import gate
from cnidra.state.layout import StateLayout
from cnidra.state.sandboxes import Attached, SandboxRecord, SandboxStore, State

SANDBOX = "a" * 64

# the gate before it forked nothing (cnidra 5d1937a's parent): what the figure compares with
BEFORE = r"""#!/bin/sh
records="$1"
wait="${2:-20}"
key='"io\.kubernetes\.cri\.sandbox-id" *: *"'
sandbox="$(sed -n "s/.*$key\([0-9A-Za-z_.-]*\)\".*/\1/p" | head -n 1)"
[ -n "$sandbox" ] || exit 1
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
exit 1
"""


def oci_state() -> bytes:
    annotations = {f"io.kubernetes.example/a{i}": "v" * 40 for i in range(15)}
    annotations["io.kubernetes.cri.sandbox-id"] = SANDBOX
    state = {
        "ociVersion": "1.2.1",
        "id": "c" * 64,
        "status": "creating",
        "pid": 42,
        "bundle": f"/run/containerd/io.containerd.runtime.v2.task/k8s.io/{'c' * 64}",
        "annotations": annotations,
    }
    return json.dumps(state, separators=(",", ":")).encode()


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_ms(argv: list[str], stdin: bytes, runs: int) -> float:
    for _ in range(5):  # warm the page cache
        subprocess.run(argv, input=stdin, capture_output=True, check=True, timeout=30)
    before = children_cpu()
    for _ in range(runs):
        subprocess.run(argv, input=stdin, capture_output=True, check=True, timeout=30)
    return round((children_cpu() - before) * 1000 / runs, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--json", action="store_true", help="only the JSON line")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cnidra-gate-bench-") as tmp:
        layout = StateLayout(Path(tmp))
        config = {
            "cniVersion": "1.0.0",
            "name": "n",
            "plugins": [{"type": "macvlan", "x": "y" * 2000}],
        }
        attachment = Attachment(ObjectRef("ns", "c", "cu"), "r0", "net1", config, "n1", "eth1")
        pod = ObjectRef("ns", "web-0", "pod-uid")
        record = SandboxRecord(
            SANDBOX, pod, "/var/run/netns/x", State.ADDED, (Attached(attachment),)
        )
        SandboxStore(layout).put_blocking(record)
        gate.install(layout.gate)
        before = Path(tmp) / "gate-before"
        before.write_text(BEFORE)
        before.chmod(0o755)
        nothing = Path(tmp) / "nothing"
        nothing.write_text("#!/bin/sh\nexit 0\n")
        nothing.chmod(0o755)
        stdin = oci_state()
        out = {
            "runs": args.runs,
            "state_bytes": len(stdin),
            "cpu_ms_per_container": {
                name: cpu_ms([str(path), str(layout.sandboxes), "1"], stdin, args.runs)
                for name, path in (("gate", layout.gate), ("before", before), ("nothing", nothing))
            },
        }
    cpu = out["cpu_ms_per_container"]
    assert isinstance(cpu, dict)
    out["gate_beyond_nothing_ms"] = round(cpu["gate"] - cpu["nothing"], 2)
    if not args.json:
        for name, ms in cpu.items():
            print(f"{name:8s} {ms:6.2f} ms of CPU a container")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
