"""A pod's attachments as one unit, with real plugins: order, rollback, the concurrent mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from cnidra.api.refs import ObjectRef
from cnidra.cni import CNIRuntime
from cnidra.cni.attach import AttachFailed, Attachment, attach_all, detach_all
from tests.cni.helpers import FAULTS, allocations, links, sh
from tests.conftest import CNITools

pytestmark = pytest.mark.netns


def macvlan(
    i: int, data_dir: Path, subnet: str | None = None, plugin: str = "macvlan"
) -> Attachment:
    conf = {
        "cniVersion": "1.1.0",
        "name": f"att{i}",
        "plugins": [
            {
                "type": plugin,
                "master": f"data{i}",
                "mode": "bridge",
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(data_dir),
                    "ranges": [[{"subnet": subnet or f"198.18.{40 + i}.0/24"}]],
                },
            }
        ],
    }
    if plugin != "macvlan":
        conf["plugins"] = [{"type": plugin}]
    return Attachment(
        ObjectRef("ns", "claim", "uid"),
        f"r{i}",
        f"net{i + 1}",
        conf,
        "pool",
        f"data{i}",
        cni_args=(("FAULT_CODE", "7"),),  # IgnoreUnknown is added by runtime_conf
    )


@pytest.fixture
def runtime(cni_tools: CNITools, tmp_path: Path, in_node: Path) -> CNIRuntime:
    for i in range(3):
        sh(
            "ip",
            "-n",
            in_node.name,
            "link",
            "add",
            f"data{i}",
            "type",
            "veth",
            "peer",
            "name",
            f"data{i}p",
        )
        sh("ip", "-n", in_node.name, "link", "set", f"data{i}", "up")
    return CNIRuntime([cni_tools.plugins, str(FAULTS)], cache_dir=str(tmp_path / "cache"))


@pytest.mark.parametrize("concurrent", [False, True])
async def test_all_attachments_come_up_and_go(
    runtime: CNIRuntime, pod_netns: Path, tmp_path: Path, concurrent: bool
) -> None:
    atts = [macvlan(i, tmp_path / "ipam") for i in range(3)]
    outcomes = await attach_all(runtime, atts, "c1", str(pod_netns), concurrent=concurrent)
    assert [o.ready for o in outcomes] == [True, True, True]
    assert {"net1", "net2", "net3"} <= set(links(pod_netns))
    assert await detach_all(runtime, atts, "c1", str(pod_netns)) == []
    assert not {"net1", "net2", "net3"} & set(links(pod_netns))
    assert all(not allocations(tmp_path, f"att{i}") for i in range(3))


@pytest.mark.parametrize("concurrent", [False, True])
async def test_one_failure_rolls_back_every_attachment(
    runtime: CNIRuntime, pod_netns: Path, tmp_path: Path, concurrent: bool
) -> None:
    atts = [
        macvlan(0, tmp_path / "ipam"),
        macvlan(1, tmp_path / "ipam", plugin="fault-error-code"),
        macvlan(2, tmp_path / "ipam"),
    ]
    with pytest.raises(AttachFailed) as info:
        await attach_all(runtime, atts, "c1", str(pod_netns), concurrent=concurrent)
    assert info.value.failed.attachment.request == "r1"
    assert "injected failure" in str(info.value) and "ns/claim" in str(info.value)
    assert not any(o.ready for o in info.value.outcomes)
    assert not {"net1", "net2", "net3"} & set(links(pod_netns))
    assert all(not allocations(tmp_path, f"att{i}") for i in range(3))
    assert not list((tmp_path / "cache" / "results").glob("*"))
