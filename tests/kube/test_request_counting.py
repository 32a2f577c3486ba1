"""Every answer the driver's apiserver client gets is counted by verb, resource and code
(cnidra_apiserver_requests_total), at the one place the client is built."""

from __future__ import annotations

from typing import Any

import httpx2
import pytest
from lightkube import AsyncClient, KubeConfig
from lightkube.config.models import Cluster, User
from lightkube.core.exceptions import ApiError
from lightkube.models.core_v1 import ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Pod
from lightkube.resources.resource_v1 import ResourceClaimStatus
from lightkube.types import PatchType

from cnidra.kube import client as module
from cnidra.observe.metrics import APISERVER_REQUESTS, request_kind


@pytest.mark.parametrize(
    ("method", "path", "query", "content_type", "kind"),
    [
        ("GET", "/api/v1/namespaces/ns/pods/p", "", "", ("get", "pods")),
        ("GET", "/api/v1/namespaces/ns/pods", "", "", ("list", "pods")),
        ("GET", "/api/v1/namespaces/ns", "", "", ("get", "namespaces")),
        ("GET", "/api/v1/nodes/n1", "", "", ("get", "nodes")),
        ("GET", "/apis/cni.networking.x-k8s.io/v1alpha1/cninetworks", "watch=true", "",
         ("watch", "cninetworks")),
        ("PATCH", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status",
         "fieldManager=cnidra&force=true", "application/apply-patch+yaml",
         ("apply", "resourceclaims/status")),
        ("PATCH", "/api/v1/namespaces/ns/pods/p", "", "application/json-patch+json",
         ("patch", "pods")),
        ("POST", "/api/v1/namespaces/ns/events", "", "application/json", ("create", "events")),
        ("DELETE", "/apis/resource.k8s.io/v1/resourceslices/s", "", "", ("delete",
         "resourceslices")),
        ("DELETE", "/apis/resource.k8s.io/v1/resourceslices", "", "", ("deletecollection",
         "resourceslices")),
        ("GET", "/version", "", "", ("get", "other")),
        ("GET", "/api/v1/namespaces/ns/pods/p/" + "x" * 300, "", "", ("get", "pods")),
    ],
)  # fmt: skip
def test_a_request_is_named_as_kubernetes_names_it(
    method: str, path: str, query: str, content_type: str, kind: tuple[str, str]
) -> None:
    assert request_kind(method, path, query, content_type) == kind


def count(verb: str, resource: str, code: str) -> float:
    value: float = APISERVER_REQUESTS.labels(verb, resource, code)._value.get()
    return value


async def test_the_drivers_client_counts_every_answer_it_gets() -> None:
    def answer(request: httpx2.Request) -> httpx2.Response:
        if request.url.path.endswith("/pods/missing"):
            return httpx2.Response(
                404, json={"kind": "Status", "code": 404, "message": "not found"}
            )
        if request.method == "POST":
            return httpx2.Response(201, content=request.content)
        if "resourceclaims" in request.url.path:
            return httpx2.Response(200, json={"apiVersion": "resource.k8s.io/v1",
                                              "kind": "ResourceClaim"})  # fmt: skip
        return httpx2.Response(200, json={"apiVersion": "v1", "kind": "Pod"})

    config = KubeConfig.from_one(cluster=Cluster(server="https://apiserver"), user=User(token="t"))
    client = module.count_requests(
        AsyncClient(config=config, transport=httpx2.MockTransport(answer))
    )
    before = {
        k: count(*k)
        for k in [
            ("get", "pods", "200"),
            ("get", "pods", "404"),
            ("apply", "resourceclaims/status", "200"),
            ("create", "events", "201"),
        ]
    }
    await client.get(Pod, "p", namespace="ns")
    await client.get(Pod, "p", namespace="ns")
    with pytest.raises(ApiError):
        await client.get(Pod, "missing", namespace="ns")
    body: dict[str, Any] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim"}
    await client.patch(ResourceClaimStatus, "c", body, namespace="ns",
                       patch_type=PatchType.APPLY, field_manager="cnidra", force=True)  # fmt: skip
    event = Event(
        metadata=ObjectMeta(generateName="p.", namespace="ns"),
        involvedObject=ObjectReference(kind="Pod", name="p", namespace="ns"),
    )
    await client.create(event)
    assert {k: count(*k) - v for k, v in before.items()} == {
        ("get", "pods", "200"): 2,
        ("get", "pods", "404"): 1,
        ("apply", "resourceclaims/status", "200"): 1,
        ("create", "events", "201"): 1,
    }


def test_a_client_without_lightkubes_httpx_connection_is_refused_at_start() -> None:
    class Other:
        class _client:  # lightkube's attribute name
            _client = object()

    with pytest.raises(TypeError, match="not httpx"):
        module.count_requests(Other())  # type: ignore[arg-type]
