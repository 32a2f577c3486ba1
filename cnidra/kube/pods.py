"""The pods bound to this node, watched as kubelet watches them (the node-scoped watch:
`fieldSelector=spec.nodeName=<node>`, every namespace), decoded into plain dicts: what the
driver reads of a pod before kubelet asks for its claims (cnidra.dra.ahead). The apiserver
streams only this node's pods, so a node's traffic does not grow with the cluster's."""

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
        fields = {"spec.nodeName": self.node}
        watched = self.api.watch(PodDocument, namespace=ALL_NAMESPACES, fields=fields)
        async for event, obj in watched:
            yield str(event), dict(obj)
