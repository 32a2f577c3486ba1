"""cnidra.kube.ipam against a fake lightkube client: what the apiserver's answers mean."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import ObjectMeta, Status
from lightkube.resources.core_v1 import Node

from cnidra.api.ipam import Block
from cnidra.kube.ipam import CNIIPBlock, KubeIPAM

BLOCK = Block("data", 0, 1, ipaddress.ip_network("198.18.130.16/28"))


class Client:
    """A block that exists already (made by `holder`), or none."""

    def __init__(self, holder: str | None) -> None:
        self.holder = holder

    async def get(self, resource: Any, name: str, **_: Any) -> Any:
        if resource is Node:
            return Node(metadata=ObjectMeta(name=name, uid=f"uid-{name}"))
        if self.holder is None:
            raise ApiError(status=Status(code=404, message="not found"))
        return CNIIPBlock(
            metadata=ObjectMeta(
                name=name,
                uid="block-uid",
                ownerReferences=[
                    {"apiVersion": "v1", "kind": "Node", "name": self.holder, "uid": "u"}
                ],
            ),
            spec={"pool": "data", "range": 0, "cidr": str(BLOCK.cidr), "node": self.holder},
        )

    async def create(self, obj: Any, **_: Any) -> Any:
        raise ApiError(status=Status(code=409, message="already exists"))


@pytest.mark.parametrize(
    ("holder", "expected"), [("a", "block-uid"), ("b", None), (None, None)]
)  # fmt: skip
async def test_a_block_that_exists_is_this_nodes_only_if_it_says_so(
    holder: str | None, expected: str | None
) -> None:
    """A create retried after its answer was lost (issue 27: transient answers are asked
    again) meets its own block: that is this node's reservation, not another node's."""
    ipam = KubeIPAM(Client(holder))  # type: ignore[arg-type]
    assert await ipam.create_block(BLOCK, "a") == expected
