"""The pods bound to this node that are still starting, watched node-scoped as kubelet watches
them (`fieldSelector=spec.nodeName=<node>,status.phase=Pending`, every namespace), decoded into
plain dicts: what the driver reads of a pod before kubelet asks for its claims
(cnidra.dra.ahead). The apiserver streams only this node's pods, so a node's traffic does not
grow with the cluster's, and of those only the ones whose claims are still to be prepared: a
pod leaving Pending is one DELETED event (it no longer matches), and none of a running pod's
later changes (its readiness, the network-status annotation, its deletion) is sent and
decoded."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from cnidra.kube.api import ALL_NAMESPACES, Api, AsyncClient, Pod

PodDocument = Pod  # the name this module's callers and tests knew


class NodePods:
    """`watch()`: (event type, pod) for each change of a pod bound to `node`; ends or raises
    (an ApiFailure) when the apiserver ends the watch or cannot be reached."""

    def __init__(self, client: AsyncClient, node: str) -> None:
        self.api = Api(client)
        self.node = node

    async def watch(self) -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
        fields = {"spec.nodeName": self.node, "status.phase": "Pending"}
        watched = self.api.watch(PodDocument, namespace=ALL_NAMESPACES, fields=fields)
        async for event, obj in watched:
            yield str(event), dict(obj)
