"""The network-status annotation as the status writer keeps it: other writers' entries stay,
a refused patch is retried on its own (no other change needed to wake the writer), and a pod
that is gone is forgotten."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest

from cnidra.api.netpolicy_node import POLICY_NETWORK_KEY
from cnidra.api.refs import ObjectRef
from cnidra.kube.session import ApiStatus
from cnidra.status.devices import DeviceStatus, NetworkStatus
from cnidra.status.writer import NETWORK_STATUS_ANNOTATION, StatusWriter

POD = ObjectRef("ns", "p", "uid-p")
MULTUS_ENTRY = {"name": "cbr0", "interface": "eth0", "ips": ["198.18.0.5"], "default": True}
OURS = NetworkStatus("ns/green", "net1", ("198.18.9.2",))


class Apiserver:
    """One pod; patches are refused while `refuse` > 0."""

    def __init__(self, refuse: int = 0) -> None:
        self.refuse = refuse
        self.gone = False
        self.annotations = {NETWORK_STATUS_ANNOTATION: json.dumps([MULTUS_ENTRY])}
        self.patches = 0
        self.called = asyncio.Event()

    async def get(self, resource: Any, name: str, namespace: str) -> dict[str, Any]:
        if self.gone:
            raise ApiStatus(404, 'pods "p" not found')
        meta = {"name": name, "namespace": namespace, "uid": POD.uid, "resourceVersion": "7"}
        return {"metadata": {**meta, "annotations": dict(self.annotations)}}

    async def patch(self, resource: Any, name: str, body: dict[str, Any], **_: Any) -> None:
        self.called.set()
        if self.refuse:
            self.refuse -= 1
            raise ConnectionError("apiserver busy")
        self.patches += 1
        self.annotations.update(body["metadata"]["annotations"])

    def entries(self) -> list[dict[str, Any]]:
        loaded: list[dict[str, Any]] = json.loads(self.annotations[NETWORK_STATUS_ANNOTATION])
        return loaded


@contextlib.asynccontextmanager
async def running(writer: StatusWriter) -> Any:
    worker = asyncio.create_task(writer.run())
    try:
        yield
    finally:
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker


async def until(check: Any, apiserver: Apiserver, within: float) -> None:
    """Until `check()` holds, looking again after each call the writer makes."""
    async with asyncio.timeout(within):
        while not check():
            apiserver.called.clear()
            await apiserver.called.wait()


async def test_ours_are_added_beside_the_primary_networks_entry_and_removed_alone() -> None:
    apiserver = Apiserver()
    writer = StatusWriter(apiserver)  # type: ignore[arg-type]
    async with running(writer):
        writer.pod_networks(POD, [OURS])
        await until(lambda: apiserver.entries() == [MULTUS_ENTRY, OURS.entry()], apiserver, 30)
        writer.pod_networks(POD, [])
        await until(lambda: apiserver.entries() == [MULTUS_ENTRY], apiserver, 30)
    assert writer.pending() == 0


async def test_a_refused_patch_is_retried_without_another_change() -> None:
    apiserver = Apiserver(refuse=1)
    writer = StatusWriter(apiserver)  # type: ignore[arg-type]
    async with running(writer):
        writer.pod_networks(POD, [OURS])
        await until(lambda: apiserver.patches == 1, apiserver, 30)  # retried after ~0.5 s
    assert apiserver.entries() == [MULTUS_ENTRY, OURS.entry()]


async def test_a_pod_that_is_gone_is_forgotten() -> None:
    apiserver = Apiserver()
    apiserver.gone = True
    writer = StatusWriter(apiserver)  # type: ignore[arg-type]
    async with running(writer):
        writer.pod_networks(POD, [OURS])
        async with asyncio.timeout(30):  # a hang's bound
            await writer.flushed()
    assert apiserver.patches == 0


@pytest.mark.parametrize(
    ("code", "message"),
    [(403, "may write only claims allocated"), (422, "invalid"),
     (409, "Precondition failed: UID in precondition: uid-c, UID in object meta: ")],
)  # fmt: skip
async def test_a_claim_status_refused_for_good_is_not_retried_forever(
    code: int, message: str
) -> None:
    """A status the apiserver refuses for good (403 from the node-scope policy for a claim no
    longer allocated here, 422, a UID precondition of a deleted claim) used to be retried every
    30 s for the life of the driver, so the queue never drained; it is dropped with a warning."""

    class Refusing:
        def __init__(self) -> None:
            self.patches = 0

        async def patch(self, *args: Any, **kw: Any) -> None:
            self.patches += 1
            raise ApiStatus(code, message)

    apiserver = Refusing()
    writer = StatusWriter(apiserver)  # type: ignore[arg-type]
    claim = ObjectRef("ns", "c", "uid-c")
    async with running(writer):
        writer.put(claim, DeviceStatus("p", "x", "", (), driver="d"))
        async with asyncio.timeout(30):  # a hang's bound
            await writer.flushed()
    assert writer.pending() == 0 and apiserver.patches == 1


def test_a_network_status_is_typed_until_it_is_written() -> None:
    """The annotation's entry from the typed NetworkStatus: Multus' fields, the empty ones left
    out, `default` always said, the policy network under its key."""
    full = NetworkStatus(
        "ns/green",
        "net1",
        ("198.18.9.2", "2001:db8::2"),
        "02:00:00:00:00:01",
        {"nameservers": ["198.18.9.1"]},
        ("198.18.9.1",),
        "cninetwork:green",
    )
    assert full.entry() == {
        "name": "ns/green",
        "interface": "net1",
        "ips": ["198.18.9.2", "2001:db8::2"],
        "default": False,
        "mac": "02:00:00:00:00:01",
        POLICY_NETWORK_KEY: "cninetwork:green",
        "dns": {"nameservers": ["198.18.9.1"]},
        "gateway": ["198.18.9.1"],
    }
    assert OURS.entry() == {
        "name": "ns/green", "interface": "net1", "ips": ["198.18.9.2"], "default": False
    }  # fmt: skip
