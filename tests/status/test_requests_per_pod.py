"""What one pod costs the apiserver (issue 28), counted on the driver itself (tests/fakenode.py:
every part wired as `cnidra driver` wires it, its real aiohttp client against the in-memory
apiserver of tests/kube/fakeapi.py): a pod with one cnidra interface from a
ResourceClaimTemplate, created and deleted, is the claim's GET (prepare), one status write
(status.devices), one pod patch (the network-status annotation), and the three Normal Events
issue 24 asked for unless they are turned off. Each write still says what it said before."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cnidra._proto.dra.v1 import api_pb2 as dra
from cnidra.api.refs import ObjectRef
from cnidra.observe import metrics
from cnidra.status import claimstatus
from cnidra.status import writer as module
from cnidra.status.devices import DeviceStatus, NetworkStatus
from tests.fakenode import MULTUS_ENTRY, NAMESPACE, NETWORK_STATUS, FakeNode
from tests.kube.fakeapi import DRIVER, FakeApiserver, a_pod
from tests.nri.fakes import FakePlugins
from tests.status.test_network_status import running as writing

OURS = NetworkStatus("pods/bench-cnidra", "net1", ("198.18.161.7",))


def kinds(api: FakeApiserver, since: int = 0) -> Counter[str]:
    return Counter(f"{verb} {resource} {code}" for verb, resource, code in api.log[since:])


def ours(api: FakeApiserver, pod: str) -> list[dict[str, Any]]:
    text = api.pods[NAMESPACE, pod]["metadata"].get("annotations", {}).get(NETWORK_STATUS)
    return json.loads(text) if text else []


def devices(api: FakeApiserver, claim: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = api.claims[NAMESPACE, claim]["status"].get("devices") or []
    return found


async def test_a_pod_costs_the_claims_get_one_status_write_one_pod_patch_and_its_events(
    tmp_path: Path,
) -> None:
    api = FakeApiserver()
    node = FakeNode(tmp_path, api, fake_plugins=True)
    counted = metrics.APISERVER_REQUESTS.labels("apply", "resourceclaims/status", "200")
    before = counted._value.get()
    async with node.running():
        running = await node.start(0)
        await node.settle()
        # what readers see while the pod runs: as before
        [entry] = devices(api, running.claim.name)
        assert (entry["driver"], entry["device"]) == (DRIVER, "eth1")
        assert entry["networkData"]["interfaceName"] == "net1"
        [status] = ours(api, running.name)
        assert (status["interface"], status["ips"]) == ("net1", ["198.18.0.2"])
        await node.stop(running)
    assert kinds(api) == {
        "get resourceclaims 200": 1,  # prepare
        "apply resourceclaims/status 200": 1,  # status.devices
        "patch pods 200": 1,  # the network-status annotation, one JSON patch
        "create events 201": 1,  # AddedInterface, one per interface (as Multus)
    }
    assert [e["reason"] for e in api.events] == ["AddedInterface"]
    assert counted._value.get() - before == 1  # the driver's own counter saw it too
    assert not api.claims  # deallocated and deleted: nothing of ours held it


async def test_with_every_normal_event_a_pod_adds_its_removal_and_the_claims_preparation(
    tmp_path: Path,
) -> None:
    api = FakeApiserver()
    node = FakeNode(tmp_path, api, fake_plugins=True, normal_events="all")
    async with node.running():
        running = await node.start(0)
        await node.settle()
        await node.stop(running)
    assert kinds(api)["create events 201"] == 3
    assert [e["reason"] for e in api.events] == ["Prepared", "AddedInterface", "RemovedInterface"]


async def test_without_normal_events_a_pod_is_three_requests(tmp_path: Path) -> None:
    api = FakeApiserver()
    node = FakeNode(tmp_path, api, fake_plugins=True, normal_events="none")
    async with node.running():
        for i in range(3):
            await node.pod(i)
    assert len(api.log) == 9 and not api.events
    assert kinds(api) == {
        "get resourceclaims 200": 3,
        "apply resourceclaims/status 200": 3,
        "patch pods 200": 3,
    }


async def test_another_writers_entry_made_after_the_sandbox_is_kept(tmp_path: Path) -> None:
    """Multus writes the primary network's entry during the runtime's CNI ADD, after kubelet
    gave the sandbox the pod's annotations: the JSON patch's test fails, the pod is read and
    merged; the next pods are read first (2 requests, not 3)."""
    api = FakeApiserver()
    node = FakeNode(tmp_path, api, fake_plugins=True, normal_events="none")
    async with node.running():
        first = await node.start(0, multus=True)
        await node.settle()
        assert ours(api, first.name)[0] == MULTUS_ENTRY
        assert [e["interface"] for e in ours(api, first.name)] == ["eth0", "net1"]
        mark = len(api.log)
        await node.stop(first)
        second = await node.start(1, multus=True)
        await node.settle()
        assert [e["interface"] for e in ours(api, second.name)] == ["eth0", "net1"]
        await node.stop(second)
        third = await node.start(2)  # no other writer: the runtime's view holds again
        await node.settle()
        await node.stop(third)
        fourth = await node.start(3)
        await node.settle()
        await node.stop(fourth)
    pods = [(verb, code) for verb, resource, code in api.log if resource == "pods"]
    assert pods[:3] == [("patch", 422), ("get", 200), ("patch", 200)]  # the first pod
    assert pods[3:5] == [("get", 200), ("patch", 200)]  # the second: read first
    assert pods[5:] == [("get", 200), ("patch", 200), ("patch", 200)]  # then one patch again
    assert kinds(api, mark)["get resourceclaims 200"] == 3


async def test_a_pod_without_annotations_gets_the_map(tmp_path: Path) -> None:
    api = FakeApiserver()
    node = FakeNode(tmp_path, api, fake_plugins=True, normal_events="none")
    async with node.running():
        running = await node.start(0, annotations=False)
        await node.settle()
        assert [e["interface"] for e in ours(api, running.name)] == ["net1"]
        await node.stop(running)
    assert kinds(api)["patch pods 200"] == 1 and len(api.log) == 3


async def test_a_pod_being_deleted_or_replaced_is_not_written() -> None:
    """The patch tests the pod's UID and that it is not being deleted: either failing, the pod
    is read, and nothing is written, as before."""
    api = FakeApiserver()
    api.pods[NAMESPACE, "going"] = a_pod(NAMESPACE, "going", "uid-1", {"a": "b"})
    api.pods[NAMESPACE, "going"]["metadata"]["deletionTimestamp"] = "2026-11-25T10:05:00Z"
    api.pods[NAMESPACE, "again"] = a_pod(NAMESPACE, "again", "uid-new", {"a": "b"})
    client = api.client()
    writer = module.StatusWriter(client)
    seen = module.SeenAnnotations(None, True)
    async with writing(writer):
        writer.pod_networks(ObjectRef(NAMESPACE, "going", "uid-1"), [OURS], seen)
        writer.pod_networks(ObjectRef(NAMESPACE, "again", "uid-old"), [OURS], seen)
        async with asyncio.timeout(30):  # a hang's bound
            await writer.flushed()
    await client.close()
    for name in ("going", "again"):
        assert NETWORK_STATUS not in api.pods[NAMESPACE, name]["metadata"]["annotations"]
    # the first's failed test makes the second read first (the runtime's view was stale)
    assert sorted(kinds(api).items()) == [("get pods 200", 2), ("patch pods 422", 1)]


async def test_holding_claims_from_attach_costs_two_requests_more(tmp_path: Path) -> None:
    api = FakeApiserver()
    node = FakeNode(
        tmp_path, api, fake_plugins=True, normal_events="none", claim_finalizer="on-attach"
    )
    async with node.running():
        running = await node.start(0)
        await node.settle()
        finalizers = api.claims[NAMESPACE, running.claim.name]["metadata"]["finalizers"]
        assert f"{DRIVER}/interfaces" in finalizers
        await node.stop(running)
    assert kinds(api)["apply resourceclaims 200"] == 2 and len(api.log) == 5
    assert not api.claims


async def test_a_failed_del_holds_the_claim_until_it_succeeds(tmp_path: Path) -> None:
    """The finalizer the default adds only when it is needed, with the real writer."""
    api = FakeApiserver()
    node = FakeNode(tmp_path, api, fake_plugins=True, normal_events="none")
    plugins = FakePlugins(failing={"macvlan": "DEL"})
    node.driver.lifecycle.runtime.exec = plugins  # type: ignore[attr-defined]
    node.driver.lifecycle.retry = lambda: module.Backoff(0.01, 0.05, jitter=0)
    async with node.running():
        running = await node.start(0)
        await node.settle()
        assert kinds(api)["apply resourceclaims 200"] == 0
        assert running.sandbox is not None
        await node.hooks.stop_pod_sandbox(running.sandbox)  # its namespace stays: retried
        await node.settle()
        meta = api.claims[NAMESPACE, running.claim.name]["metadata"]
        assert f"{DRIVER}/interfaces" in meta["finalizers"]
        answer = await node.driver.dra.node_unprepare_resources(
            dra.NodeUnprepareResourcesRequest(claims=[running.claim]), None
        )
        assert "still being removed" in answer.claims[running.claim.uid].error
        plugins.failing.clear()
        for _ in range(3000):  # 30 s: a hang's bound
            if not node.driver.lifecycle.detaches:
                break
            await asyncio.sleep(0.01)
        await node.settle()
        meta = api.claims[NAMESPACE, running.claim.name]["metadata"]
        assert f"{DRIVER}/interfaces" not in meta["finalizers"]
        await node.stop(running)
    assert kinds(api)["apply resourceclaims 200"] == 2


async def test_a_sandbox_made_again_is_one_status_write(tmp_path: Path) -> None:
    """The sandbox of a running pod dies and kubelet makes another: the removal of the first's
    entries waits DROP_GRACE, and the second's replace them: one write, not two."""
    api = FakeApiserver()
    node = FakeNode(tmp_path, api, fake_plugins=True, normal_events="none")
    async with node.running():
        running = await node.start(0)
        await node.settle()
        mark = len(api.log)
        await node.stop_sandbox(running)
        await node.settle()
        await node.sandbox(running, 1)
        await node.settle()
        assert kinds(api, mark)["apply resourceclaims/status 200"] == 1
        [entry] = devices(api, running.claim.name)
        assert "cni-p0-1" in json.dumps(entry["data"])  # the second sandbox's
        await node.stop(running)


async def test_a_removal_not_followed_by_a_release_is_written_after_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sandbox gone and none made again, the claim still prepared: its entries go after
    DROP_GRACE; a claim not made from a template is written at once when released."""
    monkeypatch.setattr(claimstatus, "DROP_GRACE", 0.05)
    api = FakeApiserver()
    node = FakeNode(tmp_path, api, fake_plugins=True, normal_events="none")
    async with node.running():
        running = await node.start(0)
        await node.settle()
        await node.stop_sandbox(running)
        assert devices(api, running.claim.name)  # not yet
        for _ in range(3000):  # 30 s: a hang's bound
            if not devices(api, running.claim.name):
                break
            await asyncio.sleep(0.01)
        assert not devices(api, running.claim.name)
        await node.stop(running)
    assert kinds(api)["apply resourceclaims/status 200"] == 2


async def test_a_shared_claims_removal_is_written_when_it_is_released() -> None:
    writer = module.StatusWriter(None)
    claim = ObjectRef("ns", "shared", "uid-s")
    entry = DeviceStatus("node-1", "eth1", "", ())
    writer.put(claim, entry)
    writer.queue.due_times["claim", claim] = (
        99.0  # as if written and due again then: only the removal waits
    )
    writer.drop(claim, [entry.key], later=True)
    assert (
        writer.queue.due_times["claim", claim] == 99.0
    )  # a removal never puts off what is due sooner
    writer.queue.due_times["claim", claim] = 1e12
    writer.released(claim, generated=False)  # other pods may hold it: written now
    assert writer.queue.due_times["claim", claim] == 0.0
    writer.released(claim, generated=True)  # deallocated next: nothing to write, nor keep
    assert claim not in writer.claims.lane and claim not in writer.claims.devices


def test_an_unplugged_interfaces_entry_goes_at_once() -> None:
    """The node API's unplug, the pod running on: nothing will release the claim soon."""
    writer = module.StatusWriter(None)
    claim = ObjectRef("ns", "c", "uid-c")
    entry = DeviceStatus("node-1", "eth1", "", ())
    writer.put(claim, entry)
    writer.queue.due_times.clear()  # as if written
    writer.drop(claim, [entry.key])
    assert writer.queue.due_times["claim", claim] == 0.0


async def test_what_the_writer_keeps_goes_with_the_pods_and_their_claims(tmp_path: Path) -> None:
    api = FakeApiserver()
    node = FakeNode(tmp_path, api, fake_plugins=True)
    async with node.running():
        for i in range(30):
            await node.pod(i, multus=i % 3 == 0)
    writer = node.driver.status
    kept = {
        f"{part}.{name}": len(getattr(getattr(writer, part), name))
        for part, names in (
            ("claims", ("devices", "status_changed", "written", "finalizers",
                        "finalizers_written", "queued_at")),
            ("pods", ("networks", "seen", "written_interfaces")),
            ("events", ("queue",)),
        )
        for name in names
    }  # fmt: skip
    # the one queue's keys and their backoffs
    kept["queue"] = len(writer.queue) + len(writer.queue.backoffs)
    assert set(kept.values()) == {0}, kept
    assert not node.driver.lifecycle.held and not api.claims
