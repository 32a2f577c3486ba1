"""The apiserver side of pool accounting against a fake client (the session's methods, on
dicts): counts go to the status subresource by server-side apply under their own field managers,
the scheduler's Events are watched by field selector, a network's pool comes from the driver's
published devices, and the accountant's Lease is taken, renewed, kept from others and taken over
once lapsed."""

from __future__ import annotations

import copy
import datetime
from collections.abc import AsyncIterator
from typing import Any

from cnidra.kube.api import Lease, ResourceSlice
from cnidra.kube.ipam import ACCOUNTANT_MANAGER, SUCCESSORS, CNIIPBlock, CNIIPPool, KubeIPAM
from cnidra.kube.session import ApiStatus

DRIVER = "cni.dra.networking.x-k8s.io"


class Client:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, dict[str, Any]]] = []
        self.lease: dict[str, Any] | None = None
        self.version = 1

    async def patch(self, kind: Any, name: str, obj: Any, **kwargs: Any) -> Any:
        self.calls.append(("patch", kind, {"name": name, "obj": obj, **kwargs}))
        if kind == Lease:
            if self.lease is None:
                raise ApiStatus(404, "not found")
            if obj["metadata"]["resourceVersion"] != self.lease["metadata"]["resourceVersion"]:
                raise ApiStatus(409, "changed")
            self.version += 1
            self.lease["spec"].update(obj["spec"])
            annotations = self.lease["metadata"].setdefault("annotations", {})
            for key, value in (obj["metadata"].get("annotations") or {}).items():
                if value is None:  # a merge patch's null removes the key
                    annotations.pop(key, None)
                else:
                    annotations[key] = value
            self.lease["metadata"]["resourceVersion"] = str(self.version)
            return copy.deepcopy(self.lease)
        return obj

    async def get(self, kind: Any, name: str, **kwargs: Any) -> Any:
        self.calls.append(("get", kind, {"name": name, **kwargs}))
        if kind == Lease and self.lease is not None:
            return copy.deepcopy(self.lease)
        raise ApiStatus(404, "not found")

    async def create(self, kind: Any, obj: Any, **kwargs: Any) -> Any:
        self.calls.append(("create", kind, kwargs))
        if self.lease is not None:
            raise ApiStatus(409, "exists")
        self.lease = copy.deepcopy(dict(obj))
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.lease)

    def list(self, kind: Any, **kwargs: Any) -> AsyncIterator[Any]:
        self.calls.append(("list", kind, kwargs))

        async def answer() -> AsyncIterator[Any]:
            if kind == ResourceSlice:
                yield (
                    {
                        "metadata": {"name": "n1-x"},
                        "spec": {
                            "driver": DRIVER,
                            "nodeName": "n1",
                            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
                            "devices": [
                                {
                                    "name": "net-a",
                                    "attributes": {
                                        "network": {"string": "net-a"},
                                        "ipPool": {"string": "pool-a"},
                                    },
                                },
                                {"name": "eth1", "attributes": {"network": {"string": "x"}}},
                            ],
                        },
                    }
                )

        return answer()

    async def watch(self, kind: Any, **kwargs: Any) -> AsyncIterator[tuple[str, Any]]:
        self.calls.append(("watch", kind, kwargs))
        yield (
            "ADDED",
            {
                "metadata": {"name": "e", "namespace": "ns"},
                "involvedObject": {"kind": "Pod", "name": "p3", "namespace": "ns"},
                "reason": "FailedScheduling",
            },
        )


async def test_counts_go_to_the_status_subresource_by_server_side_apply() -> None:
    client = Client()
    ipam = KubeIPAM(client, node="n1")
    await ipam.write_block_leased("pool-a.0.0", 3)
    await ipam.write_pool_status("pool-a", {"size": 2, "held": 2, "free": 0})
    (_, block_kind, block), (_, pool_kind, pool) = [c for c in client.calls if c[0] == "patch"]
    assert block_kind == CNIIPBlock.Status and pool_kind == CNIIPPool.Status
    assert block["obj"]["status"] == {"leased": 3} and block["field_manager"] == "cnidra-node-n1"
    assert pool["obj"]["status"]["held"] == 2 and pool["field_manager"] == ACCOUNTANT_MANAGER
    assert block["patch_type"] == pool["patch_type"] == "apply"


async def test_the_scheduler_is_watched_by_field_selector_and_networks_from_slices() -> None:
    client = Client()
    ipam = KubeIPAM(client, node="n1")
    events = [e async for e in ipam.watch_failed_scheduling()]
    assert events[0][1]["involvedObject"]["name"] == "p3"
    # every namespace's ("*": the client's own namespace otherwise), filtered by the apiserver
    assert client.calls[0][2] == {"namespace": "*", "fields": {"reason": "FailedScheduling"}}
    assert await ipam.network_pools() == {"net-a": "pool-a"}
    assert client.calls[-1][2]["fields"] == {"spec.driver": DRIVER}


async def test_one_lease_holder_until_it_lapses() -> None:
    client = Client()
    a, b = KubeIPAM(client, node="a"), KubeIPAM(client, node="b")
    assert await a.lead("ns", "acc", "a", 15)  # none: created
    assert not await b.lead("ns", "acc", "b", 15)  # held and fresh
    assert await a.lead("ns", "acc", "a", 15)  # renewed
    assert client.lease is not None
    old = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=60)
    client.lease["spec"]["renewTime"] = old.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert await b.lead("ns", "acc", "b", 15)  # lapsed: taken over
    assert client.lease["spec"]["holderIdentity"] == "b"
    assert not await a.lead("ns", "acc", "a", 15)


async def test_the_holder_renews_with_one_patch_and_reads_again_when_another_wrote() -> None:
    client = Client()
    a, b = KubeIPAM(client, node="a"), KubeIPAM(client, node="b")
    assert await a.lead("ns", "acc", "a", 15, ["b"])  # none: read, created
    client.calls.clear()
    for _ in range(3):
        assert await a.lead("ns", "acc", "a", 15, ["b"])
    assert [c[0] for c in client.calls] == ["patch"] * 3  # renewals: no GET before each
    assert a.successors == frozenset({"b"})
    assert client.lease is not None
    old = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=60)
    client.lease["spec"]["renewTime"] = old.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert await b.lead("ns", "acc", "b", 15)  # lapsed: taken over
    client.calls.clear()
    assert not await a.lead("ns", "acc", "a", 15)  # its PATCH refused, the Lease read: b's
    assert [c[0] for c in client.calls] == ["patch", "get"]
    assert client.lease["spec"]["holderIdentity"] == "b"
    client.lease = None  # deleted under its holder: read, then created again
    client.calls.clear()
    assert await b.lead("ns", "acc", "b", 15)
    assert [c[0] for c in client.calls] == ["patch", "get", "create"]


async def test_the_holder_names_its_successors_and_each_candidate_reads_them() -> None:
    client = Client()
    a, b, c = (KubeIPAM(client, node=n) for n in "abc")
    assert await a.lead("ns", "acc", "a", 15, ["b"])  # created, naming b
    assert client.lease is not None
    assert client.lease["metadata"]["annotations"] == {SUCCESSORS: "b"}
    assert not await c.lead("ns", "acc", "c", 15)
    assert c.successors == frozenset({"b"})
    assert await a.lead("ns", "acc", "a", 15, ["b", "c"])  # renewed, naming both
    assert not await b.lead("ns", "acc", "b", 15) and b.successors == frozenset({"b", "c"})
    assert await a.lead("ns", "acc", "a", 15)  # no node known: none named
    assert SUCCESSORS not in client.lease["metadata"]["annotations"]
    assert not await c.lead("ns", "acc", "c", 15) and c.successors is None
