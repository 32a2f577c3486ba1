"""bench.transport without a control plane: its figures, the bodies it sends, the stall check
and the timing loop on stand-ins; against a loopback HTTP server, the driver's own client (the
`cnidra` transport: requests, bodies, streamed watches, the request counting, no answer in
time as Transient) and bench/aiohttp_transport.py (httpx2's transport interface over aiohttp)
under lightkube, with aiohttp's failures as httpx2's (bench only: lightkube and httpx2 are the
dev extra's, for this comparison)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
from aiohttp import web
from lightkube import AsyncClient, KubeConfig
from lightkube.config.models import Cluster, User
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Namespace as LightNamespace
from lightkube.types import PatchType

from bench import transport
from bench.aiohttp_transport import AiohttpTransport
from cnidra.kube.api import Api, Namespace, NotFound, Transient
from cnidra.observe import metrics
from tests.kube.fakeapi import a_client

STATUS = """Name:\tpython
VmPeak:\t  200000 kB
VmRSS:\t   51200 kB
RssAnon:\t   30720 kB
RssFile:\t   20480 kB
RssShmem:\t       0 kB
"""


def test_proc_status_reads_the_three_figures() -> None:
    assert transport.proc_status(STATUS) == {"VmRSS": 51200, "RssAnon": 30720, "RssFile": 20480}
    mine = transport.proc_status()
    assert mine["VmRSS"] >= mine["RssAnon"] > 0


def test_op_figures() -> None:
    got = transport.op_figures(0.02, 0.5, [0.001] * 99 + [0.101])
    assert got["n"] == 100
    assert got["cpu_ms"] == 0.2  # 20 ms over 100 requests
    assert got["p50_ms"] == 1.0
    assert 1.0 < got["p99_ms"] <= 101.0
    assert got["per_s"] == 200.0
    assert transport.op_figures(0.0, 0.0, [])["n"] == 0


def test_the_status_applied_names_the_allocated_device() -> None:
    name = transport.claim_names()[3]
    result = transport.allocation_body(name)["status"]["allocation"]["devices"]["results"][0]
    device = transport.status_body(name, 7)["status"]["devices"][0]
    assert (device["driver"], device["pool"], device["device"]) == (
        result["driver"],
        result["pool"],
        result["device"],
    )
    request = transport.claim_object(name)["spec"]["devices"]["requests"][0]["name"]
    assert result["request"] == request
    # each apply is a write: the message changes
    assert transport.status_body(name, 1) != transport.status_body(name, 2)
    assert len(set(transport.claim_names())) == transport.CLAIMS == transport.CONCURRENT


def result(cpu: float, rss: float, stalled: int) -> dict[str, Any]:
    ops = {op: {"cpu_ms": cpu, "p50_ms": 1.0, "p99_ms": 2.0} for op in transport.OPS}
    return {
        "ops": ops,
        "rss": {"added_vmrss_mib": rss, "added_rssanon_mib": rss / 2},
        "stall": {"stalled": stalled},
    }


def test_summary_is_the_median_of_the_rounds_and_reports_every_transport() -> None:
    line = transport.summary(
        {
            "lightkube-h2": [result(0.6, 15.0, 0), result(0.8, 15.2, 0), result(0.7, 15.1, 0)],
            "aiohttp": [result(0.2, 13.0, 0)],
            "lightkube-h2-shared": [{"ops": {}, "rss": {}, "stall": {"stalled": 3}}],
        }
    )
    assert line["cpu_ms"]["lightkube-h2"]["get_1"] == 0.7
    assert line["rss_added_mib"]["lightkube-h2"] == {"vmrss": 15.1, "rssanon": 7.55}
    assert line["stalls"] == {"lightkube-h2": 0, "aiohttp": 0, "lightkube-h2-shared": 3}
    assert "lightkube-h2-shared" not in line["cpu_ms"]
    text = transport.report(line)
    assert "aiohttp: CPU 0.2" in text
    assert "lightkube-h2-shared: stalls 3" in text
    json.dumps(line, allow_nan=False)


def test_the_flags() -> None:
    with pytest.raises(SystemExit):
        transport.main(["--requests", "15"])
    with pytest.raises(SystemExit):
        transport.main(["--only", "curl"])
    with pytest.raises(SystemExit):
        transport.make_way("curl", "/nonexistent")
    assert {"lightkube-h2", "httpx2-h2", "httpx2-h1", "aiohttp"} <= set(transport.TRANSPORTS)


async def test_timed_counts_only_after_the_warm_up() -> None:
    calls: list[tuple[int, int]] = []

    async def call(k: int, i: int) -> None:
        calls.append((k, i))
        await asyncio.sleep(0)

    got = await transport.timed(call, 40, 10)
    assert got["n"] == 40
    assert len(calls) == 40 + transport.WARM_UP
    assert {k for k, _ in calls} == set(range(10))


class StallingWay:
    """A GET waits while any watch is open (what httpcore's HTTP/2 lock did), or not."""

    def __init__(self, stalls: bool) -> None:
        self.stalls = stalls
        self.open = 0

    async def get(self, name: str) -> dict[str, str]:
        if self.stalls and self.open:
            await asyncio.Event().wait()
        return {"name": name}

    async def watch(self) -> AsyncIterator[Any]:
        self.open += 1
        try:
            await asyncio.Event().wait()
            yield None
        finally:
            self.open -= 1


async def test_stall_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "STALL_SECONDS", 0.05)
    monkeypatch.setattr(transport.asyncio, "sleep", _no_sleep)
    fine = await transport.stall_check(StallingWay(False), ["a", "b"])
    assert fine["stalled"] == 0
    assert fine["gets"] == transport.STALL_GETS
    stuck = StallingWay(True)
    bad = await transport.stall_check(stuck, ["a"])
    assert bad["stalled"] == 3  # stops at the third
    assert stuck.open == 0  # the watches were closed


_sleep = asyncio.sleep


async def _no_sleep(seconds: float) -> None:
    await _sleep(0)


# ------------------------------------------------------------------ AiohttpTransport


def answer(obj: dict[str, Any], status: int = 200) -> web.Response:
    """JSON as the apiserver sends it (Content-Type exactly application/json: lightkube reads
    a failure's Status only then)."""
    return web.Response(
        body=json.dumps(obj).encode(), status=status, content_type="application/json"
    )


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A loopback HTTP server speaking a little of the apiserver's API."""
    seen: list[dict[str, Any]] = []

    async def namespace(request: web.Request) -> web.Response:
        seen.append({"method": request.method, "query": dict(request.query)})
        name = request.match_info["name"]
        if name == "missing":
            body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404}
            return answer({**body, "message": "not found", "reason": "NotFound"}, 404)
        if name == "slow":
            await asyncio.sleep(1)
        obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "uid": "u"}}
        return answer(obj)

    async def patch(request: web.Request) -> web.Response:
        seen.append(
            {
                "method": request.method,
                "query": dict(request.query),
                "type": request.headers["Content-Type"],
                "body": await request.json(),
            }
        )
        obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x", "uid": "u"}}
        return answer(obj)

    async def watch(request: web.Request) -> web.StreamResponse:
        seen.append({"method": request.method, "query": dict(request.query)})
        response = web.StreamResponse()
        await response.prepare(request)
        for name in ("a", "b"):
            obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            await response.write(json.dumps({"type": "ADDED", "object": obj}).encode() + b"\n")
            await asyncio.sleep(0.01)
        return response

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{name}", namespace)
    app.router.add_patch("/api/v1/namespaces/{name}", patch)
    app.router.add_get("/api/v1/namespaces", watch)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


def client_for(url: str, read_timeout: float = 10.0) -> AsyncClient:
    config = KubeConfig.from_one(cluster=Cluster(server=url), user=User())
    return AsyncClient(
        config=config,
        timeout=httpx2.Timeout(10.0, read=read_timeout),
        field_manager="test",
        transport=AiohttpTransport(None),
    )


async def test_the_drivers_client_on_aiohttp(server: tuple[str, list[dict[str, Any]]]) -> None:
    """The `cnidra` transport: the driver's own client (cnidra.kube.session) through Api."""
    url, seen = server
    client = a_client(url)
    api = Api(client, 5.0)
    before = metrics.APISERVER_REQUESTS.labels("get", "namespaces", "200")._value.get()
    try:
        got = await api.get(Namespace, "one")
        assert got["metadata"]["name"] == "one"
        assert await api.get_or_none(Namespace, "missing") is None
        with pytest.raises(NotFound):
            await api.get(Namespace, "missing")
        await api.apply(Namespace, "x", {"metadata": {"labels": {"a": "b"}}})
        events = [(e, o["metadata"]["name"]) async for e, o in _two(api.watch(Namespace))]
        assert events == [("ADDED", "a"), ("ADDED", "b")]
    finally:
        await client.close()
    after = metrics.APISERVER_REQUESTS.labels("get", "namespaces", "200")._value.get()
    assert after - before == 1  # counted in the session
    applied = next(s for s in seen if s["method"] == "PATCH")
    assert applied["type"] == "application/apply-patch+yaml"
    assert applied["query"] == {"fieldManager": "cnidra", "force": "true"}
    labels = {"metadata": {"labels": {"a": "b"}}}
    assert applied["body"] == {"apiVersion": "v1", "kind": "Namespace", **labels}
    assert any(s["query"].get("watch") == "true" for s in seen)


async def test_lightkube_over_aiohttp(server: tuple[str, list[dict[str, Any]]]) -> None:
    """The `lightkube-aiohttp` transport: lightkube's client over AiohttpTransport."""
    url, seen = server
    client = client_for(url)
    try:
        got = await client.get(LightNamespace, "one")
        assert got.metadata is not None and got.metadata.name == "one"
        with pytest.raises(ApiError):
            await client.get(LightNamespace, "missing")
        await client.patch(
            LightNamespace, "x", {"metadata": {"labels": {"a": "b"}}}, patch_type=PatchType.APPLY
        )
        names = []
        async for _, obj in client.watch(LightNamespace):
            names.append(obj.metadata.name)
            if len(names) == 2:
                break
        assert names == ["a", "b"]
    finally:
        await client.close()
    applied = next(s for s in seen if s["method"] == "PATCH")
    assert applied["type"] == "application/apply-patch+yaml"
    assert applied["query"]["fieldManager"] == "test"


async def _two(events: AsyncIterator[Any]) -> AsyncIterator[Any]:
    count = 0
    async for event in events:
        yield event
        count += 1
        if count == 2:
            return


async def test_failures_come_back_as_httpx2s(server: tuple[str, list[dict[str, Any]]]) -> None:
    url, _ = server
    slow = client_for(url, read_timeout=0.2)
    try:
        with pytest.raises(httpx2.ReadTimeout):
            await slow.get(LightNamespace, "slow")
    finally:
        await slow.close()
    closed = client_for("http://127.0.0.1:9")  # discard: nothing listens
    try:
        with pytest.raises(httpx2.ConnectError):
            await closed.get(LightNamespace, "x")
    finally:
        await closed.close()


async def test_the_drivers_client_reads_no_answer_in_time_as_transient(
    server: tuple[str, list[dict[str, Any]]],
) -> None:
    url, _ = server
    client = a_client(url)
    try:
        with pytest.raises(Transient, match="TimeoutError"):
            await Api(client, 0.2).get(Namespace, "slow")
    finally:
        await client.close()
    closed = a_client("http://127.0.0.1:9")  # discard: nothing listens
    try:
        with pytest.raises(Transient):
            await Api(closed, 5.0).get(Namespace, "x")
    finally:
        await closed.close()


def test_what_lightkube_added_to_the_drivers_imports() -> None:
    """In a fresh process (here lightkube is imported already)."""
    got = transport.run_driver_plus(transport.LIGHTKUBE, 120.0)
    assert got["library"] == transport.LIGHTKUBE
    assert got["driver_vmrss_mib"] > 20
    assert got["added_vmrss_mib"] > 0 and got["added_rssanon_mib"] > 0
