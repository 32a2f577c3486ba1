"""The pods bound to this node, watched as kubelet watches them (the node-scoped watch:
`fieldSelector=spec.nodeName=<node>`, every namespace), decoded into plain dicts: what the
driver reads of a pod before kubelet asks for its claims (cnidra.dra.ahead). The apiserver
streams only this node's pods, so a node's traffic does not grow with the cluster's."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from lightkube import ALL_NS, AsyncClient
from lightkube.core.resource import ApiInfo, ResourceDef
from lightkube.generic_resource import GenericNamespacedResource

from cnidra.kube.api import Api


class PodDocument(GenericNamespacedResource):
    """core/v1 Pod as the apiserver's JSON, decoded into plain dicts (not lightkube's model:
    the fields read here, status.resourceClaimStatuses among them, whatever its version)."""

    _api_info = ApiInfo(
        resource=ResourceDef("", "v1", "Pod"),
        plural="pods",
        verbs=["global_list", "global_watch", "list", "watch"],
    )


class NodePods:
    """`watch()`: (event type, pod) for each change of a pod bound to `node`; ends or raises
    (an ApiFailure) when the apiserver ends the watch or cannot be reached."""

    def __init__(self, client: AsyncClient, node: str) -> None:
        self.api = Api(client)
        self.node = node

    async def watch(self) -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
        fields = {"spec.nodeName": self.node}
        async for event, obj in self.api.watch(PodDocument, namespace=ALL_NS, fields=fields):
            yield str(event), dict(obj)
