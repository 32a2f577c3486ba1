"""Named fakes for cnidra IPAM: an apiserver holding pools, blocks, IPAMClaims and nodes in
memory, with the same answers as the real one (409 on a second create, resourceVersion
preconditions), and ways to make it slow, down, or fail one call."""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cnidra.api.ipam import IPAMCLAIM_FINALIZER, IPAMCLAIM_NODE_LABEL, Block, BlockObject
from cnidra.api.refs import ObjectRef
from cnidra.cni.attach import Attachment
from cnidra.ipam.allocator import Allocator
from cnidra.kube.session import ApiStatus
from cnidra.state.checkpoint import PreparedClaim
from cnidra.state.ipam import IPAMState
from cnidra.state.layout import StateLayout


class ApiDown(Exception):
    pass


@dataclass
class FakeApiserver:
    pools: dict[str, dict[str, Any]] = field(default_factory=dict)
    blocks: dict[str, BlockObject] = field(default_factory=dict)
    ipamclaims: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    nodes: set[str] = field(default_factory=set)
    # "namespace/claim" -> the addresses its device status shows (allocated claims only)
    claim_status: dict[str, list[str]] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    down: bool = False
    latency: float = 0.0
    # call number (0-based, as counted in `calls`) -> the (code, message) ApiStatus it raises:
    # an answer the apiserver adapter gives up on (not transient, or its last retry failed);
    # the allocator asks an IPAMCluster nothing twice, so it fails what it was doing
    failing: dict[int, tuple[int, str]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    _versions: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def pool(self, name: str, spec: Mapping[str, Any]) -> None:
        self.pools[name] = {"metadata": {"name": name}, "spec": dict(spec)}

    def ipamclaim(self, namespace: str, name: str, **status: Any) -> dict[str, Any]:
        obj = {
            "metadata": {
                "namespace": namespace,
                "name": name,
                "uid": f"uid-{namespace}-{name}-{next(self._versions)}",
                "resourceVersion": str(next(self._versions)),
                "finalizers": [],
                "labels": {},
            },
            "spec": {"network": "data", "interface": "net1"},
            "status": dict(status),
        }
        self.ipamclaims[(namespace, name)] = obj
        return obj

    def delete_ipamclaim(self, namespace: str, name: str) -> None:
        """As the apiserver does: with finalizers it is only marked."""
        obj = self.ipamclaims[(namespace, name)]
        if obj["metadata"]["finalizers"]:
            obj["metadata"]["deletionTimestamp"] = "2026-11-22T00:00:00Z"
        else:
            del self.ipamclaims[(namespace, name)]

    def delete_node(self, name: str) -> None:
        """As the garbage collector does: the Node's blocks go with it."""
        self.nodes.discard(name)
        for block in [b for b in self.blocks.values() if b.node == name]:
            del self.blocks[block.name]

    async def _call(self, what: str) -> None:
        number = len(self.calls)
        self.calls.append(what)
        if self.latency:
            await asyncio.sleep(self.latency)
        if self.down:
            raise ApiDown(f"{what}: connection refused")
        if number in self.failing:
            code, message = self.failing.pop(number)
            raise ApiStatus(code, message)


class FakeCluster:
    """cnidra.ipam.allocator.IPAMCluster over a FakeApiserver."""

    def __init__(self, api: FakeApiserver) -> None:
        self.api = api

    async def pool(self, name: str) -> Mapping[str, Any] | None:
        await self.api._call(f"get pool {name}")
        return copy.deepcopy(self.api.pools.get(name))

    async def pools(self) -> list[Mapping[str, Any]]:
        await self.api._call("list pools")
        return copy.deepcopy(list(self.api.pools.values()))

    async def blocks(self, pool: str | None = None, node: str | None = None) -> list[BlockObject]:
        await self.api._call("list blocks")
        return [
            b
            for b in self.api.blocks.values()
            if (pool is None or b.pool == pool) and (node is None or b.node == node)
        ]

    async def create_block(self, block: Block, node: str) -> str | None:
        await self.api._call(f"create block {block.name}")
        if block.name in self.api.blocks:  # this node's: a create whose answer was lost
            existing = self.api.blocks[block.name]
            return existing.uid if existing.node == node else None
        uid = f"block-uid-{next(self.api._versions)}"
        self.api.blocks[block.name] = BlockObject(
            block.name, block.pool, node, uid, str(next(self.api._versions))
        )
        return uid

    async def delete_block(self, name: str, uid: str) -> None:
        await self.api._call(f"delete block {name}")
        if name in self.api.blocks and self.api.blocks[name].uid == uid:
            del self.api.blocks[name]

    async def own_block(self, block: BlockObject, node: str) -> None:
        await self.api._call(f"own block {block.name}")

    async def ipamclaim(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        await self.api._call(f"get ipamclaim {namespace}/{name}")
        return copy.deepcopy(self.api.ipamclaims.get((namespace, name)))

    async def bind_ipamclaim(
        self, claim: Mapping[str, Any], ips: Sequence[str], pod: str, node: str
    ) -> bool:
        meta = claim["metadata"]
        await self.api._call(f"bind ipamclaim {meta['namespace']}/{meta['name']}")
        current = self.api.ipamclaims.get((meta["namespace"], meta["name"]))
        if current is None or current["metadata"]["resourceVersion"] != meta["resourceVersion"]:
            return False
        current["metadata"]["finalizers"].append(IPAMCLAIM_FINALIZER)
        current["metadata"]["labels"][IPAMCLAIM_NODE_LABEL] = node
        current["metadata"]["resourceVersion"] = str(next(self.api._versions))
        current["status"] = {"ips": list(ips), "ownerPod": {"name": pod}}
        return True

    async def bound_ipamclaims(self) -> list[Mapping[str, Any]]:
        await self.api._call("list ipamclaims")
        return [
            copy.deepcopy(o)
            for o in self.api.ipamclaims.values()
            if IPAMCLAIM_NODE_LABEL in o["metadata"]["labels"]
        ]

    async def unbind_ipamclaim(self, claim: Mapping[str, Any]) -> None:
        meta = claim["metadata"]
        await self.api._call(f"unbind ipamclaim {meta['namespace']}/{meta['name']}")
        key = (meta["namespace"], meta["name"])
        current = self.api.ipamclaims.get(key)
        if current is None:
            return
        current["metadata"]["finalizers"].remove(IPAMCLAIM_FINALIZER)
        if current["metadata"].get("deletionTimestamp") and not current["metadata"]["finalizers"]:
            del self.api.ipamclaims[key]

    async def node_exists(self, name: str) -> bool:
        await self.api._call(f"get node {name}")
        return name in self.api.nodes

    async def addresses_in_use(self, namespace: str) -> dict[str, str]:
        await self.api._call(f"list resourceclaims {namespace}")
        return {
            address: claim
            for claim, addresses in self.api.claim_status.items()
            if claim.startswith(f"{namespace}/")
            for address in addresses
        }

    async def record(self, obj: Mapping[str, Any], reason: str, message: str) -> None:
        meta = obj["metadata"]
        await self.api._call(f"event {meta['namespace']}/{meta['name']}")
        self.api.events.append((f"{meta['namespace']}/{meta['name']}", reason, message))


def node_allocator(api: FakeApiserver, root: Path, node: str) -> Allocator:
    api.nodes.add(node)
    return Allocator(node, IPAMState(StateLayout(root / node)), FakeCluster(api))


def claim_using(
    pool: str, uid: str, *, namespace: str = "default", ipam_claim: str | None = None
) -> PreparedClaim:
    """A prepared claim whose one request's network asks for cnidra IPAM from `pool`."""
    ref = ObjectRef(namespace, f"claim-{uid}", uid)
    network = {
        "cniVersion": "1.0.0",
        "name": "data",
        "plugins": [{"type": "macvlan", "ipam": {"type": "cnidra", "pool": pool}}],
    }
    attachment = Attachment(
        ref, "net", "net1", network, "pool", "dev", ipam_claim=ipam_claim, network_label="data"
    )
    return PreparedClaim(ref, (f"pod-{uid}",), (attachment,))


def addresses_of(claim: PreparedClaim) -> list[str]:
    ipam = claim.devices[0].network["plugins"][0]["ipam"]
    assert ipam["type"] == "static", ipam
    return [a["address"] for a in ipam["addresses"]]
