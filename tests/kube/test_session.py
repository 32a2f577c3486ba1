"""The wire below Api (cnidra.kube.session) against a loopback aiohttp.web apiserver: list
paging, what a watch sends and how it goes on (resourceVersion, bookmarks, an ERROR event),
Retry-After, the timeouts, the apply's query and media type, the kubeconfig and service
account, and the webhook's synchronous client."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from cnidra.kube.api import (
    Api,
    ApiFailure,
    Conflict,
    DeviceClass,
    NotFound,
    Pod,
    ResourceClaimStatus,
    Transient,
    get_or_none_sync,
    get_sync,
)
from cnidra.kube.session import (
    AsyncClient,
    Client,
    ConfigError,
    KubeConfig,
    cluster_wide,
    selector,
)
from tests.kube.fakeapi import LoopbackServer, a_client

Widget = cluster_wide("example.com", "v1", "Widget", "widgets")


def widget(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version}}


class Apiserver:
    """Widgets to list in pages of `limit`, and watches scripted one a request."""

    def __init__(self) -> None:
        self.seen: list[web.Request] = []
        self.queries: list[dict[str, str]] = []
        self.watches: list[list[dict[str, Any]]] = []

    async def answer(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(request)
        query = dict(request.query)
        self.queries.append(query)
        if request.path.endswith("/throttled"):
            body = {"kind": "Status", "code": 429, "message": "slow down"}
            return web.json_response(body, status=429, headers={"Retry-After": "7"})
        if request.path.endswith("/slow"):
            await asyncio.sleep(2)
        if request.path.endswith("/taken"):
            body = {"kind": "Status", "code": 409, "message": "the object has been modified"}
            return web.json_response(body, status=409)
        if request.method == "PATCH":
            return web.json_response({"kind": "Widget", "body": await request.json()})
        if query.get("watch") == "true":
            return await self._watch(request)
        if request.path == "/apis/example.com/v1/widgets":
            start = int(query.get("continue") or 0)
            limit = int(query["limit"])
            items = [widget(f"w{i}", str(i)) for i in range(start, min(start + limit, 5))]
            more = str(start + limit) if start + limit < 5 else ""
            return web.json_response({"items": items, "metadata": {"continue": more}})
        body = {"kind": "Status", "code": 404, "message": "not found"}
        return web.json_response(body, status=404)

    async def _watch(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for event in self.watches.pop(0) if self.watches else []:
            await response.write(json.dumps(event).encode() + b"\n")
        return response  # the apiserver ends the watch


@pytest.fixture
async def served() -> AsyncIterator[tuple[Apiserver, AsyncClient]]:
    apiserver = Apiserver()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", apiserver.answer)
    async with TestServer(app) as server:
        client = a_client(str(server.make_url("")))
        try:
            yield apiserver, client
        finally:
            await client.close()


async def test_a_list_follows_continue_to_the_last_page(
    served: tuple[Apiserver, AsyncClient],
) -> None:
    apiserver, client = served
    names = [o["metadata"]["name"] async for o in client.list(Widget, chunk_size=2)]
    assert names == ["w0", "w1", "w2", "w3", "w4"]
    assert [q.get("continue") for q in apiserver.queries] == [None, "2", "4"]
    listed = await Api(client).list(Widget, labels={"a": "b", "c": None})
    assert len(listed) == 5 and apiserver.queries[-1]["labelSelector"] == "a=b,c"


async def test_a_watch_goes_on_from_the_last_version_and_keeps_bookmarks_to_itself(
    served: tuple[Apiserver, AsyncClient],
) -> None:
    apiserver, client = served
    apiserver.watches = [
        [{"type": "ADDED", "object": widget("a", "5")}],
        [{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}],
        [
            {"type": "MODIFIED", "object": widget("a", "11")},
            {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}},
        ],
    ]
    seen = []
    with pytest.raises(ApiFailure) as failed:
        async for event, obj in Api(client).watch(Widget, fields={"metadata.name": "a"}):
            seen.append((event, obj["metadata"]["resourceVersion"]))
    assert failed.value.code == 410  # too old: the caller lists again
    assert seen == [("ADDED", "5"), ("MODIFIED", "11")]
    versions = [q.get("resourceVersion") for q in apiserver.queries]
    assert versions == [None, "5", "9"]
    assert all(q["allowWatchBookmarks"] == "true" for q in apiserver.queries)
    assert all(q["fieldSelector"] == "metadata.name=a" for q in apiserver.queries)
    # each watch asks for its own time in [5, 10) minutes, as client-go's reflectors do
    assert all(300 <= int(q["timeoutSeconds"]) < 600 for q in apiserver.queries)
    # each event as it was written, not deflated by the apiserver and inflated here; a
    # request keeps gzip (the apiserver uses it above 128 KiB)
    assert all(r.headers["Accept-Encoding"] == "identity" for r in apiserver.seen)
    assert len([o async for o in client.list(Widget)]) == 5
    assert "gzip" in apiserver.seen[-1].headers["Accept-Encoding"]


async def test_retry_after_and_conflicts_are_the_one_tables(
    served: tuple[Apiserver, AsyncClient],
) -> None:
    _, client = served
    with pytest.raises(Transient) as throttled:
        await Api(client).get(Widget, "throttled")
    assert throttled.value.code == 429 and throttled.value.retry_after == 7.0
    with pytest.raises(Conflict, match="modified"):
        await Api(client).get(Widget, "taken")
    with pytest.raises(NotFound):
        await Api(client).get(Widget, "other")
    with pytest.raises(Transient, match="TimeoutError"):
        await Api(client, 0.2).get(Widget, "slow")


async def test_an_apply_is_typed_forced_and_managed(served: tuple[Apiserver, AsyncClient]) -> None:
    apiserver, client = served
    got = await Api(client).apply(
        ResourceClaimStatus, "c", {"status": {}}, namespace="ns", field_manager="m"
    )
    request = apiserver.seen[-1]
    assert request.path == "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status"
    assert request.headers["Content-Type"] == "application/apply-patch+yaml"
    assert dict(request.query) == {"fieldManager": "m", "force": "true"}
    assert got["body"] == {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                           "status": {}}  # fmt: skip
    assert request.headers["Authorization"] == "Bearer t"
    await Api(client).merge_patch(Pod, "p", {"metadata": {}}, namespace="ns")
    assert apiserver.seen[-1].headers["Content-Type"] == "application/merge-patch+json"
    await Api(client).json_patch(Pod, "p", [{"op": "test", "path": "/a", "value": 1}])
    assert apiserver.seen[-1].path == "/api/v1/namespaces/default/pods/p"  # the config's own
    assert apiserver.seen[-1].headers["Content-Type"] == "application/json-patch+json"


def test_selectors() -> None:
    assert selector({"a": "b", "c": None, "d": ["y", "x"]}) == "a=b,c,d in (x,y)"


def test_a_kubeconfig_gives_the_server_the_token_the_namespace_and_a_tls_context(
    tmp_path: Path,
) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://10.0.0.1:6443/"}}],
        "users": [{"name": "u", "user": {"token": "secret"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": "team"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    read = KubeConfig.from_file(path)
    assert read.server == "https://10.0.0.1:6443" and read.namespace == "team"
    assert read.authorization() == "Bearer secret"
    assert isinstance(read.ssl_context, ssl.SSLContext)
    config["clusters"][0]["cluster"]["certificate-authority-data"] = base64.b64encode(
        b"not a certificate"
    ).decode()
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ssl.SSLError):
        KubeConfig.from_file(path)
    config["current-context"] = "missing"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match="missing"):
        KubeConfig.from_file(path)


def test_the_service_account_needs_the_service_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match="KUBERNETES_SERVICE_HOST"):
        KubeConfig.from_service_account(tmp_path)


def test_the_webhooks_client_reads_through_http_client() -> None:
    """Its worker threads' GETs, over a connection each thread keeps."""

    async def answer(request: web.Request) -> web.Response:
        if request.match_info["name"] == "gone":
            return web.json_response({"kind": "Status", "code": 404, "message": "no"}, status=404)
        assert request.headers["Authorization"] == "Bearer t"
        return web.json_response({"metadata": {"name": request.match_info["name"]}})

    app = web.Application()
    app.router.add_get("/apis/resource.k8s.io/v1/deviceclasses/{name}", answer)
    server = LoopbackServer(app)
    client = Client(KubeConfig(server.url, token="t"), timeout=5.0)
    got: list[Any] = []

    def read() -> None:
        got.append(get_sync(client, DeviceClass, "a")["metadata"]["name"])
        got.append(get_or_none_sync(client, DeviceClass, "gone"))

    threads = [threading.Thread(target=read) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(got, key=str) == [None, None, None, "a", "a", "a"]
    closed = Client(KubeConfig("http://127.0.0.1:9"), timeout=2.0)
    with pytest.raises(Transient):
        get_sync(closed, DeviceClass, "a")


def test_an_exec_plugin_gives_the_token_again_once_it_expired(tmp_path: Path) -> None:
    """A kubeconfig user's exec credential plugin (as cloud kubeconfigs have): run for the
    first request, and again only once its token expired."""
    runs = tmp_path / "runs"
    plugin = tmp_path / "plugin"
    plugin.write_text(
        "#!/bin/sh\necho x >> " + str(runs) + "\n"
        'echo \'{"kind": "ExecCredential", "status": {"token": "from-plugin-\'$N\'", '
        '"expirationTimestamp": "2000-01-01T00:00:00Z"}}\'\n'
    )
    plugin.chmod(0o755)
    exec_spec = {"command": str(plugin), "env": [{"name": "N", "value": "1"}]}
    config = {
        "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"exec": exec_spec}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    read = KubeConfig.from_file(path)
    assert read.authorization() == "Bearer from-plugin-1"
    assert read.authorization() == "Bearer from-plugin-1"
    assert len(runs.read_text().split()) == 2  # expired (in 2000): asked again
    exec_spec["command"] = str(tmp_path / "missing")
    path.write_text(yaml.safe_dump(config))
    with pytest.raises((ConfigError, OSError)):
        KubeConfig.from_file(path).authorization()


async def test_a_watch_that_ends_at_once_empty_is_a_failure_not_a_loop(
    served: tuple[Apiserver, AsyncClient],
) -> None:
    """Something between (a proxy) closing every watch at once: the caller's backoff decides
    when to watch again, not a tight loop of requests."""
    apiserver, client = served
    with pytest.raises(Transient, match="ended at once"):
        async for _ in Api(client).watch(Widget):
            pass
    assert len(apiserver.queries) == 1
