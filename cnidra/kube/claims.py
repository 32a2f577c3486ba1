"""ResourceClaims as prepare needs them: one GET per claim, with a timeout.

A claim is decoded once, from the apiserver's JSON into plain dicts, and read from those by
`cnidra.dra.claim.read_claim`: not into a typed model and back to dicts, which cost a prepare
three times the decoding itself (and made a field of an unexpected type a decoding failure,
reported as an unreachable apiserver, instead of read_claim's message naming the field).

There is no cluster-wide watch: kubelet names the claims a pod on this node needs, and asking
for exactly those keeps a node's memory and apiserver traffic independent of how many claims
other nodes have (a watch would stream every tenant's claim to every node). With the apiserver
down, the checkpoint answers for claims prepared before."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from cnidra.api.errors import UnusableObject
from cnidra.kube.api import Api, ApiFailure, AsyncClient, Namespace, NotFound, ResourceClaim
from cnidra.observe import metrics

log = logging.getLogger(__name__)


class ClaimUnavailable(Exception):
    pass


ClaimDocument = ResourceClaim  # the name this module's callers and tests knew


class ClaimGetter:
    def __init__(self, client: AsyncClient, timeout: float = 5.0) -> None:
        self.client = client
        self.api = Api(client, timeout)
        self.timeout = timeout

    async def get(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            obj = await self.api.get(ClaimDocument, name, namespace)
        except RecursionError:
            metrics.CLAIM_LOOKUPS.labels("error").inc()
            raise UnusableObject(
                f"claim {namespace}/{name} is nested too deeply to be read; it is refused"
            ) from None
        except NotFound:
            metrics.CLAIM_LOOKUPS.labels("not-found").inc()
            return None
        except Exception as exc:
            metrics.CLAIM_LOOKUPS.labels("error").inc()
            if isinstance(exc, ApiFailure) and exc.code is not None:
                raise ClaimUnavailable(f"apiserver refused GET {namespace}/{name}: {exc}") from None
            cause = exc.__cause__ if isinstance(exc, ApiFailure) and exc.__cause__ else exc
            raise ClaimUnavailable(  # timeouts, connection errors
                f"apiserver unreachable for {namespace}/{name}: {type(cause).__name__}: {cause}"
            ) from None
        metrics.CLAIM_LOOKUPS.labels("ok").inc()
        return dict(obj)


class NamespaceGetter:
    """A namespace's labels, for CNIPolicy namespace selectors; None when they cannot be read
    (the policy then does not cover the claim: nothing is allowed on a guess)."""

    def __init__(self, client: AsyncClient, timeout: float = 5.0) -> None:
        self.client = client
        self.api = Api(client, timeout)
        self.timeout = timeout

    async def labels(self, namespace: str) -> Mapping[str, str] | None:
        try:
            obj = await self.api.get(Namespace, namespace)
        except Exception as exc:
            log.warning("labels of namespace %s not read: %s", namespace, exc)
            return None
        return dict((obj.get("metadata") or {}).get("labels") or {})
