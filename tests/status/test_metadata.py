"""Device metadata for containers (KEP-5304) as prepare and the hook write it: the files and
CDI specs where kubelet's library would put them, the JSON a container reads, network data
filled in place (a bind mount keeps its inode), kept across a re-prepare, gone at unprepare."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from cnidra.api.refs import ObjectRef
from cnidra.dra.prepare import Preparer
from cnidra.state.checkpoint import Checkpoint
from cnidra.state.layout import StateLayout
from cnidra.status.metadata import DeviceMetadata
from tests.dra.test_prepare import DIRS, VIEW, Claims, named

DRIVER = "cni.dra.networking.x-k8s.io"


def read(path: Path) -> dict[str, Any]:
    [line] = path.read_text().splitlines()
    doc: dict[str, Any] = json.loads(line)
    return doc


async def test_prepare_writes_what_a_container_reads_and_the_hook_fills_it(
    tmp_path: Path,
) -> None:
    metadata = DeviceMetadata(tmp_path / "plugin", tmp_path / "cdi")
    claim = named("pod-net-abcde", "u-1", 2)
    claim["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "net"}
    checkpoint = Checkpoint(StateLayout(tmp_path / "state"))
    view = replace(VIEW, attributes={"eth1": {"ifName": {"string": "eth1"}}})
    preparer = Preparer("n1", Claims(claim), checkpoint, DIRS, view=lambda: view, metadata=metadata)
    ref = ObjectRef("ns", "pod-net-abcde", "u-1")
    prepared = await preparer.prepare(ref)
    assert preparer.cdi_device_ids(prepared, "r0") == [f"{DRIVER}/metadata=u-1_r0"]

    host = tmp_path / "cdi" / f"{DRIVER}-metadata" / "ns_pod-net-abcde_r0.json"
    doc = read(host)
    assert doc["apiVersion"] == "metadata.resource.k8s.io/v1alpha1"
    assert doc["kind"] == "DeviceMetadata" and doc["podClaimName"] == "net"
    assert doc["metadata"] == {
        "name": "pod-net-abcde", "namespace": "ns", "uid": "u-1", "generation": 1
    }  # fmt: skip
    assert doc["requests"] == [
        {
            "name": "r0",
            "devices": [
                {
                    "driver": DRIVER,
                    "pool": "n1",
                    "name": "eth1",
                    "attributes": {"ifName": {"string": "eth1"}},  # as the ResourceSlice has them
                }
            ],
        }
    ]
    spec = json.loads((tmp_path / "cdi" / f"{DRIVER}_metadata_u-1_r0.json").read_text())
    assert spec["kind"] == f"{DRIVER}/metadata" and spec["cdiVersion"] == "0.5.0"
    [device] = spec["devices"]
    assert device["name"] == "u-1_r0"
    assert device["containerEdits"]["mounts"] == [
        {
            "hostPath": str(host),
            "containerPath": "/var/run/kubernetes.io/dra-device-attributes/"
            f"resourceclaimtemplates/net/r0/{DRIVER}-metadata.json",
            "options": ["ro", "bind"],
        }
    ]

    inode = host.stat().st_ino
    data = {"interfaceName": "pod-net-abcde0", "ips": ["198.18.0.2/24"]}
    metadata.attached(ref, "r0", "n1", "eth1", data)
    doc = read(host)
    assert doc["requests"][0]["devices"][0]["networkData"] == data
    assert doc["metadata"]["generation"] == 2 and host.stat().st_ino == inode

    await preparer.prepare(ref)  # kubelet prepares again after a restart: the data stays
    assert read(host)["requests"][0]["devices"][0]["networkData"] == data

    await preparer.unprepare(ref)
    assert not [p for p in (tmp_path / "cdi").rglob("*") if not p.is_dir()]
    assert not (tmp_path / "plugin").exists()  # nothing on the node's disk


def test_a_claim_named_in_the_pod_spec_is_found_by_its_own_name(tmp_path: Path) -> None:
    from cnidra.state.checkpoint import PreparedClaim

    metadata = DeviceMetadata(tmp_path, tmp_path)
    claim = PreparedClaim(ObjectRef("ns", "shared-net", "u"), (), ())
    assert str(metadata.container_file(claim, "net")) == (
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/shared-net/net/"
        f"{DRIVER}-metadata.json"
    )


async def test_a_pod_claim_name_the_claims_author_wrote_is_never_a_path(tmp_path: Path) -> None:
    """The annotation is Kubernetes' on claims from templates, but anyone who creates a claim
    can write it: only a DNS label (a pod's claim name) becomes a path segment."""
    metadata = DeviceMetadata(tmp_path / "plugin", tmp_path / "cdi")
    claim = named("mine", "u-2", 1)
    claim["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "../../../etc"}
    preparer = Preparer(
        "n1", Claims(claim), Checkpoint(StateLayout(tmp_path / "state")), DIRS,
        view=lambda: VIEW, metadata=metadata,
    )  # fmt: skip
    prepared = await preparer.prepare(ObjectRef("ns", "mine", "u-2"))
    assert prepared.pod_claim_name is None
    spec = json.loads((tmp_path / "cdi" / f"{DRIVER}_metadata_u-2_r0.json").read_text())
    [mount] = spec["devices"][0]["containerEdits"]["mounts"]
    assert mount["containerPath"] == (
        f"/var/run/kubernetes.io/dra-device-attributes/resourceclaims/mine/r0/{DRIVER}-metadata.json"
    )


def test_a_subrequest_is_filed_under_its_parent_request(tmp_path: Path) -> None:
    from cnidra.cni.attach import Attachment
    from cnidra.state.checkpoint import PreparedClaim

    metadata = DeviceMetadata(tmp_path / "plugin", tmp_path / "cdi")
    ref = ObjectRef("ns", "c", "u-3")
    att = Attachment(ref, "nic/fast", "net1", {"name": "n"}, "n1", "eth1")
    metadata.prepare(PreparedClaim(ref, ("pod",), (att,)))
    host = tmp_path / "cdi" / f"{DRIVER}-metadata" / "ns_c_nic.json"
    assert read(host)["requests"][0]["name"] == "nic/fast"  # the allocation's own name inside
    assert (tmp_path / "cdi" / f"{DRIVER}_metadata_u-3_nic.json").exists()
    metadata.attached(ref, "nic/fast", "n1", "eth1", {"interfaceName": "net1"})
    assert read(host)["requests"][0]["devices"][0]["networkData"] == {"interfaceName": "net1"}


def test_a_file_of_the_per_claim_layout_is_moved_at_start_with_its_network_data(
    tmp_path: Path,
) -> None:
    """Before, each claim had directories of its own (<ns>_<claim>/<request>/metadata.json); at
    start the file moves to the flat name in the same directory, the same inode (a running
    container mounts it) with the network data the hook wrote, and the CDI spec names it
    there."""
    from cnidra.cni.attach import Attachment
    from cnidra.state.checkpoint import PreparedClaim

    metadata = DeviceMetadata(tmp_path / "plugin", tmp_path / "cdi")
    ref = ObjectRef("ns", "c", "u-4")
    claim = PreparedClaim(ref, ("pod",), (Attachment(ref, "nic", "net1", {}, "n1", "eth1"),))
    old = tmp_path / "plugin" / "dra-device-metadata" / "ns_c" / "nic" / "metadata.json"
    old.parent.mkdir(parents=True)
    old.write_text(json.dumps({"requests": [{"name": "nic", "devices": [{"networkData": 1}]}]}))
    inode = old.stat().st_ino
    metadata.restore(claim)
    host = metadata.host_file(ref, "nic")
    assert host == tmp_path / "plugin" / "dra-device-metadata" / "ns_c_nic.json"
    assert host.stat().st_ino == inode and read(host)["requests"][0]["devices"][0]["networkData"]
    assert not (tmp_path / "plugin" / "dra-device-metadata" / "ns_c").exists()
    spec = json.loads((tmp_path / "cdi" / f"{DRIVER}_metadata_u-4_nic.json").read_text())
    assert spec["devices"][0]["containerEdits"]["mounts"][0]["hostPath"] == str(host)
    metadata.remove(ref, None)  # requests unknown: found by name
    assert not host.exists() and not list((tmp_path / "cdi").glob("*.json"))


def test_a_file_an_earlier_cnidra_wrote_on_the_disk_stays_in_use_and_new_ones_go_to_the_tmpfs(
    tmp_path: Path,
) -> None:
    """An upgrade: a claim prepared by a cnidra that wrote its file in the kubelet plugin
    directory keeps that file (running containers mount its inode): the spec written again
    at start names it, the hook's network data goes into it, unprepare removes it. A claim
    prepared after goes beside the CDI specs."""
    from cnidra.cni.attach import Attachment
    from cnidra.state.checkpoint import PreparedClaim

    metadata = DeviceMetadata(tmp_path / "plugin", tmp_path / "cdi")
    old_ref, new_ref = ObjectRef("ns", "old", "u-5"), ObjectRef("ns", "new", "u-6")
    old = PreparedClaim(old_ref, ("pod",), (Attachment(old_ref, "nic", "net1", {}, "n1", "eth1"),))
    new = PreparedClaim(new_ref, ("pod",), (Attachment(new_ref, "nic", "net1", {}, "n1", "eth1"),))
    disk = tmp_path / "plugin" / "dra-device-metadata" / "ns_old_nic.json"
    disk.parent.mkdir(parents=True)
    document = {"metadata": {"generation": 1}, "requests": [{"name": "nic", "devices": []}]}
    disk.write_text(json.dumps(document) + "\n")
    inode = disk.stat().st_ino
    metadata.restore(old)
    metadata.prepare(old)  # kubelet prepares it again after the restart
    metadata.attached(old_ref, "nic", "n1", "eth1", {"interfaceName": "net1"})
    assert disk.stat().st_ino == inode and read(disk)["metadata"]["generation"] == 2
    spec = json.loads((tmp_path / "cdi" / f"{DRIVER}_metadata_u-5_nic.json").read_text())
    assert spec["devices"][0]["containerEdits"]["mounts"][0]["hostPath"] == str(disk)
    assert not (tmp_path / "cdi" / f"{DRIVER}-metadata" / "ns_old_nic.json").exists()
    metadata.prepare(new)
    fresh = tmp_path / "cdi" / f"{DRIVER}-metadata" / "ns_new_nic.json"
    assert fresh.exists() and metadata.host_file(new_ref, "nic") == fresh
    metadata.remove(old_ref, ["nic"])
    assert not disk.exists()
    metadata.prepare(old)  # prepared anew after: beside the CDI specs
    assert metadata.host_file(old_ref, "nic").parent == tmp_path / "cdi" / f"{DRIVER}-metadata"
