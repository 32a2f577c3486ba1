"""Upgrading from cnidra 0.1's layout (user's network name, cache and host-local pools in the
shared CNI directory) with real plugins: no pod loses its interface, the next pod of the same
network gets another address, the DEL later frees everything, and nothing else is touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from cnidra.api.refs import ObjectRef
from cnidra.cni import CNIRuntime
from cnidra.cni.attach import Attachment, attach_all, detach_all
from cnidra.state.layout import StateLayout
from cnidra.state.migrate import migrate_legacy
from cnidra.state.sandboxes import Attached, SandboxRecord, SandboxStore, State
from tests.cni.helpers import addresses, sh
from tests.conftest import CNITools

pytestmark = pytest.mark.netns


def old_network(legacy: Path) -> dict[str, object]:
    """As 0.1 ran it: the user's name, host-local in the shared directory."""
    return {
        "cniVersion": "1.1.0",
        "name": "data",
        "plugins": [
            {
                "type": "macvlan",
                "master": "data0",
                "mode": "bridge",
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(legacy / "networks"),
                    "ranges": [[{"subnet": "198.18.60.0/24"}]],
                },
            }
        ],
    }


async def test_an_attachment_of_cnidra_0_1_survives_the_upgrade_and_is_deleted_later(
    cni_tools: CNITools, tmp_path: Path, in_node: Path, pod_netns: Path
) -> None:
    sh("ip", "-n", in_node.name, "link", "add", "data0", "type", "veth", "peer", "name", "d0p")
    sh("ip", "-n", in_node.name, "link", "set", "data0", "up")
    legacy, layout = tmp_path / "shared-cni", StateLayout(tmp_path / "cnidra")
    # somebody else's state in the shared directory, which the migration must not touch
    (legacy / "results").mkdir(parents=True)
    (legacy / "results" / "k8s-pod-network-primary-eth0").write_text('{"kind":"cniCacheV1"}')
    (legacy / "networks" / "data").mkdir(parents=True)
    (legacy / "networks" / "data" / "198.18.60.99").write_text("other-pod\r\nnet1")

    claim = ObjectRef("ns", "claim", "cu")
    old = Attached(Attachment(claim, "r", "net1", old_network(legacy), "pool", "data0"))
    await attach_all(
        CNIRuntime([cni_tools.plugins], cache_dir=str(legacy)),
        [old.attachment],
        "old",
        str(pod_netns),
    )
    [address] = addresses(pod_netns, "net1")
    store = SandboxStore(layout)
    pod = ObjectRef("ns", "p", "pu")
    store.put_blocking(SandboxRecord("old", pod, str(pod_netns), State.ADDED, (old,)))

    report = migrate_legacy(layout, legacy, SandboxStore(layout))
    assert (report.attachments, report.cache_entries, report.reservations) == (1, 1, 1)
    assert migrate_legacy(layout, legacy, SandboxStore(layout)).attachments == 0  # idempotent

    [record] = SandboxStore(layout).all()
    [attached] = record.attachments
    att = attached.attachment
    assert att.network["name"] == "cnidra-ns.ns.data" and att.network_label == "data"
    assert addresses(pod_netns, "net1") == {address}
    assert [p.name for p in (legacy / "results").iterdir()] == ["k8s-pod-network-primary-eth0"]
    left = {p.name for p in (legacy / "networks" / "data").iterdir() if p.name[0].isdigit()}
    assert left == {"198.18.60.99"}
    pool = layout.ipam / "cnidra-ns.ns.data"
    assert address.split("/")[0] in {p.name for p in pool.iterdir()}

    # the next pod of that network draws from the migrated pool: another address
    runtime = CNIRuntime([cni_tools.plugins], cache_dir=str(layout.cni_cache))
    with_net = Attachment(claim, "r", "net2", att.network, "pool", "data0")
    [outcome] = await attach_all(runtime, [with_net], "new", str(pod_netns))
    assert outcome.result is not None
    assert addresses(pod_netns, "net2") and addresses(pod_netns, "net2") != {address}

    # DEL of the old pod works from the record and cnidra's own cache, and frees the address
    assert not await detach_all(runtime, [att], "old", str(pod_netns))
    assert not await detach_all(runtime, [with_net], "new", str(pod_netns))
    assert "net1" not in sh("ip", "-n", pod_netns.name, "link")
    assert not [p for p in pool.iterdir() if p.name[0].isdigit()]
    assert not list((layout.cni_cache / "results").iterdir())
