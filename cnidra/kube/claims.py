"""ResourceClaims as prepare needs them: one GET per claim, with a timeout.

There is no cluster-wide watch: kubelet names the claims a pod on this node needs, and asking
for exactly those keeps a node's memory and apiserver traffic independent of how many claims
other nodes have (a watch would stream every tenant's claim to every node). With the apiserver
down, the checkpoint answers for claims prepared before."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceClaim

from cnidra.observe import metrics

log = logging.getLogger(__name__)


class ClaimUnavailable(Exception):
    pass


class ClaimGetter:
    def __init__(self, client: AsyncClient, timeout: float = 5.0) -> None:
        self.client = client
        self.timeout = timeout

    async def get(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            async with asyncio.timeout(self.timeout):
                obj = await self.client.get(ResourceClaim, name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                metrics.CLAIM_LOOKUPS.labels("not-found").inc()
                return None
            metrics.CLAIM_LOOKUPS.labels("error").inc()
            raise ClaimUnavailable(f"apiserver refused GET {namespace}/{name}: {exc}") from None
        except Exception as exc:  # timeouts, connection errors
            metrics.CLAIM_LOOKUPS.labels("error").inc()
            raise ClaimUnavailable(
                f"apiserver unreachable for {namespace}/{name}: {type(exc).__name__}: {exc}"
            ) from None
        metrics.CLAIM_LOOKUPS.labels("ok").inc()
        claim: dict[str, Any] = obj.to_dict()
        return claim


async def node_labels(client: AsyncClient, node: str) -> dict[str, str] | None:
    """The node's labels, for allocation node selectors; None when they cannot be read."""
    try:
        async with asyncio.timeout(5.0):
            obj = await client.get(Node, node)
    except Exception as exc:
        log.warning(
            "labels of node %s not read (%s); selectors are checked by name only", node, exc
        )
        return None
    return dict(obj.metadata.labels or {}) if obj.metadata else {}
