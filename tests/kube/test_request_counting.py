"""Every answer the driver's apiserver client gets is counted by verb, resource and code
(cnidra_apiserver_requests_total), in the one session every request goes through
(cnidra.kube.session)."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from cnidra.kube.api import Api, Event, NotFound, Pod, ResourceClaimStatus
from cnidra.observe.metrics import APISERVER_REQUESTS, request_kind
from tests.kube.fakeapi import a_client


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
    async def answer(request: web.Request) -> web.Response:
        if request.path.endswith("/pods/missing"):
            return web.json_response(
                {"kind": "Status", "code": 404, "message": "not found"}, status=404
            )
        if request.method == "POST":
            return web.json_response(await request.json(), status=201)
        if "resourceclaims" in request.path:
            return web.json_response({"apiVersion": "resource.k8s.io/v1",
                                      "kind": "ResourceClaim"})  # fmt: skip
        return web.json_response({"apiVersion": "v1", "kind": "Pod"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    before = {
        k: count(*k)
        for k in [
            ("get", "pods", "200"),
            ("get", "pods", "404"),
            ("apply", "resourceclaims/status", "200"),
            ("create", "events", "201"),
        ]
    }
    async with TestServer(app) as server:
        client = a_client(str(server.make_url("")).rstrip("/"))
        api = Api(client)
        await api.get(Pod, "p", "ns")
        await api.get(Pod, "p", "ns")
        with pytest.raises(NotFound):
            await api.get(Pod, "missing", "ns")
        body: dict[str, Any] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim"}
        await api.apply(ResourceClaimStatus, "c", body, namespace="ns", field_manager="cnidra")
        event = {"metadata": {"generateName": "p.", "namespace": "ns"},
                 "involvedObject": {"kind": "Pod", "name": "p", "namespace": "ns"}}  # fmt: skip
        await api.create(Event, event)
        await client.close()
    assert {k: count(*k) - v for k, v in before.items()} == {
        ("get", "pods", "200"): 2,
        ("get", "pods", "404"): 1,
        ("apply", "resourceclaims/status", "200"): 1,
        ("create", "events", "201"): 1,
    }
