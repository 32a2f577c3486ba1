"""A watch-backed cache of the ResourceClaims allocated to this node with devices of ours."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.resources.resource_v1 import ResourceClaim

from cnidra.api.constants import DRIVER_NAME
from cnidra.dra import metrics

log = logging.getLogger(__name__)


class ClaimUnavailable(Exception):
    pass


def allocated_here(claim: Mapping[str, Any], node: str) -> bool:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    if not any(r.get("driver") == DRIVER_NAME for r in results):
        return False
    selector = allocation.get("nodeSelector") or {}
    for term in selector.get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and node not in (field.get("values") or []):
                return False
    return True


def has_pods(claim: Mapping[str, Any]) -> bool:
    return any(
        r.get("resource") == "pods" for r in (claim.get("status") or {}).get("reservedFor") or []
    )


class ClaimCache:
    def __init__(self, client: AsyncClient, node: str, timeout: float = 5.0) -> None:
        self.client = client
        self.node = node
        self.timeout = timeout
        self._claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.synced = asyncio.Event()

    def __len__(self) -> int:
        return len(self._claims)

    def _store(self, claim: dict[str, Any]) -> None:
        meta = claim.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if allocated_here(claim, self.node):
            self._claims[key] = claim
        else:
            self._claims.pop(key, None)

    async def get(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        cached = self._claims.get((namespace, name))
        if cached is not None and has_pods(cached):
            metrics.CLAIM_CACHE.labels("hit").inc()
            return cached
        metrics.CLAIM_CACHE.labels("miss" if cached is None else "stale").inc()
        try:
            async with asyncio.timeout(self.timeout):
                obj = await self.client.get(ResourceClaim, name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            if cached is not None:
                return cached
            raise ClaimUnavailable(f"apiserver refused GET {namespace}/{name}: {exc}") from None
        except (TimeoutError, OSError, Exception) as exc:  # httpx errors, timeouts
            if cached is not None:
                return cached
            raise ClaimUnavailable(
                f"apiserver unreachable for {namespace}/{name}: {type(exc).__name__}: {exc}"
            ) from None
        claim: dict[str, Any] = obj.to_dict()
        self._store(claim)
        return claim

    async def run(self) -> None:
        """List then watch, forever; relist after errors with backoff."""
        backoff = 0.5
        while True:
            try:
                await self._list_and_watch()
                backoff = 0.5
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "claim watch failed (%s: %s); retrying in %.1fs",
                    type(exc).__name__,
                    exc,
                    backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    async def _list_and_watch(self) -> None:
        listing = self.client.list(ResourceClaim, namespace="*")
        fresh: dict[tuple[str, str], dict[str, Any]] = {}
        async for obj in listing:
            claim = obj.to_dict()
            if allocated_here(claim, self.node):
                meta = claim["metadata"]
                fresh[(meta["namespace"], meta["name"])] = claim
        self._claims = fresh
        self.synced.set()
        version = listing.resourceVersion
        async for event, obj in self.client.watch(
            ResourceClaim, namespace="*", resource_version=version
        ):
            claim = obj.to_dict()
            if event == "DELETED":
                meta = claim.get("metadata") or {}
                self._claims.pop((meta.get("namespace", ""), meta.get("name", "")), None)
            else:
                self._store(claim)
