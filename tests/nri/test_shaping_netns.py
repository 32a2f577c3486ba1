"""Issue 44 end to end on one machine: the real hook path (checkpoint, PodLifecycle, the CNI
runtime with the ptp plugin's veth, cnidra.datapath.shaping) holds a pod interface to its
claim's rate in both directions right after its ADD; an unplug's DEL takes the interface and
the removal after it takes the IFB; a sandbox's DEL takes the interface and its qdiscs."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from cnidra._proto.nri.v1alpha1 import api_pb2 as nri
from cnidra.api.bandwidth import Rate
from cnidra.api.ownership import owned_network, owned_network_name
from cnidra.api.refs import ObjectRef
from cnidra.cni import CNIRuntime
from cnidra.cni.attach import Attachment
from cnidra.datapath import shaping
from cnidra.nri.lifecycle import HookBudget, PodLifecycle
from cnidra.state.checkpoint import Checkpoint, PreparedClaim
from cnidra.state.layout import StateLayout
from cnidra.state.sandboxes import SandboxStore
from tests.cni.helpers import links
from tests.conftest import CNITools
from tests.nri.fakes import RecordingStatus

pytestmark = pytest.mark.netns

LIMIT = Rate(20 * 10**6, 20 * 10**6)


def ptp(root: Path, label: str, subnet: str) -> dict[str, Any]:
    conflist = {
        "cniVersion": "1.1.0",
        "name": label,
        "plugins": [
            {
                "type": "ptp",
                "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]]},
            }
        ],
    }
    return owned_network(
        conflist, owned_network_name(label, "ns"), StateLayout(root).private_dirs()
    )


def claim(root: Path, name: str, if_name: str, subnet: str, on_demand: bool) -> PreparedClaim:
    ref = ObjectRef("ns", name, f"{name}-uid")
    att = Attachment(
        ref,
        "req0",
        if_name,
        ptp(root, name, subnet),
        "node",
        "dev0",
        network_label=name,
        on_demand=on_demand,
        rate=LIMIT,
    )
    return PreparedClaim(ref, ("a-uid",), (att,))


def qdiscs(ns: Path, dev: str) -> str:
    return subprocess.run(
        ["tc", "-n", ns.name, "qdisc", "show", "dev", dev],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip


async def test_the_hook_path_shapes_a_veth_and_a_del_takes_it_away(
    cni_tools: CNITools, in_node: Path, pod_netns: Path, tmp_path: Path
) -> None:
    layout = StateLayout(tmp_path)
    checkpoint = Checkpoint(layout)
    checkpoint.put_blocking(claim(tmp_path, "fast", "net1", "198.18.60.0/24", on_demand=False))
    checkpoint.put_blocking(claim(tmp_path, "extra", "net2", "198.18.61.0/24", on_demand=True))
    lifecycle = PodLifecycle(
        checkpoint,
        CNIRuntime([cni_tools.plugins], cache_dir=str(layout.cni_cache)),
        SandboxStore(layout),
        RecordingStatus(),
        budget=HookBudget(attach=8.0, request_timeout=10.0),
    )  # the real shaper: cnidra.datapath.shaping
    sandbox = nri.PodSandbox(id="a-sandbox", name="a", namespace="ns", uid="a-uid")
    sandbox.linux.namespaces.add(type="network", path=str(pod_netns))

    assert await lifecycle.attach(sandbox) == 1
    net1 = shaping.read(pod_netns, "net1")
    assert net1.complete and net1.egress and net1.ingress
    assert net1.egress.limit == LIMIT and net1.ingress.limit == LIMIT
    assert "htb" in qdiscs(pod_netns, "net1")
    assert net1.ifb in links(pod_netns)
    status = lifecycle.reporting.status
    assert isinstance(status, RecordingStatus)
    [entry] = status.entries[ObjectRef("ns", "fast", "fast-uid")].values()
    assert entry["conditions"][1]["message"] == "net1 is held to 20Mbit/s in each direction"

    await lifecycle.plug("a-sandbox", "extra", "req0")
    net2 = shaping.read(pod_netns, "net2")
    assert net2.complete and net2.egress is not None and net2.egress.limit == LIMIT
    await lifecycle.unplug("a-sandbox", "extra", "req0")
    left = links(pod_netns)
    assert "net2" not in left and shaping.ifb_name("net2") not in left  # the IFB removed too
    assert "net1" in left and shaping.read(pod_netns, "net1").complete  # the other untouched

    assert await lifecycle.detach("a-sandbox", None)
    left = links(pod_netns)
    assert "net1" not in left  # DEL took the veth, and the qdiscs on it
    # its IFB stays until the sandbox's namespace goes (the runtime removes it right after)
    with pytest.raises(shaping.Gone):
        shaping.read(pod_netns, "net1")
