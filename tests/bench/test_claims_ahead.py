"""bench.claims_ahead's parts without a control plane: the deep size of what the read-ahead
holds, the request log and the per-minute figure (bench.fleet runs the whole at 1,000 nodes)."""

from __future__ import annotations

import asyncio
import json
import sys

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from bench import claims_ahead
from cnidra.dra.ahead import ClaimsAhead, ReadAhead


def test_deep_size_counts_what_is_held_once() -> None:
    text = "x" * 1000
    one = claims_ahead.deep_size({"a": text})
    assert one >= 1000 + sys.getsizeof({})
    # the same string held twice counts once
    assert claims_ahead.deep_size({"a": text, "b": text}) < one + 200
    nested = claims_ahead.deep_size([[{"k": [text]}]])
    assert nested > 1000


async def test_the_tables_of_a_claim_kept() -> None:
    cache = ClaimsAhead()

    reader = ReadAhead(lambda: None, None, cache)  # type: ignore[arg-type]
    empty = claims_ahead.deep_size(claims_ahead.tables(cache, reader))
    claim = {
        "metadata": {"uid": "u1", "resourceVersion": "7", "namespace": "ns", "name": "c"},
        "spec": {"devices": {"requests": [{"name": "net", "note": "y" * 4000}]}},
    }
    assert cache.put(claim)
    held = claims_ahead.deep_size(claims_ahead.tables(cache, reader))
    assert held - empty > 4000  # the claim itself is what a kept claim costs
    assert claims_ahead.managed_fields(claim) == []
    fields = [{"manager": "kube-scheduler", "fieldsV1": {"f:status": {}}}]
    assert claims_ahead.managed_fields({"metadata": {"managedFields": fields}}) == fields


async def test_the_log_counts_by_kind_and_time() -> None:
    log = claims_ahead.Log()

    async def answer(request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/{tail:.*}", answer)
    async with (
        TestServer(app) as server,
        aiohttp.ClientSession(trace_configs=[log.tracer()]) as http,
    ):
        for path in (
            "/api/v1/pods?watch=true&fieldSelector=spec.nodeName%3Dn",
            "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c",
        ):
            async with http.get(str(server.make_url("")).rstrip("/") + path) as response:
                await response.read()
    kinds = [k for _, k in log.entries]
    assert kinds == ["watch pods", "get resourceclaims"]
    assert sum(log.between(0.0, float("inf")).values()) == 2
    assert not log.between(0.0, log.entries[0][0])


def test_per_minute() -> None:
    assert claims_ahead.per_minute(3, 30.0) == 6.0
    assert claims_ahead.kib_to_mib(1536) == 1.5


async def test_one_nodes_claims_ahead_measured_on_the_fake_apiserver() -> None:
    """measure() end to end on tests/kube's fake apiserver: the node's pod watch (held open),
    its pod's claim read and kept, the memory read, nothing sent at rest."""
    from tests.kube.fakeapi import NODE, FakeApiserver, allocated_claim
    from tests.kube.test_node_pods import bound_pod

    class Answering(FakeApiserver):
        def __init__(self) -> None:
            super().__init__()
            self.watches = 0

        async def _serve(self, request: web.Request) -> web.StreamResponse:
            if request.path == "/api/v1/pods" and request.query.get("watch"):
                # a watch's body: its events, then nothing for as long as it is held
                self.watches += 1
                line = json.dumps({"type": "ADDED", "object": bound_pod()}).encode() + b"\n"
                held = web.StreamResponse(headers={"Content-Type": "application/json"})
                await held.prepare(request)
                await held.write(line)
                await asyncio.Event().wait()
            if request.path == "/api/v1/namespaces/default":  # the bench's first GET
                obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}}
                return web.json_response(obj)
            return await super()._serve(request)

    api = Answering()
    api.claims["team-a", "web-0-dev-x"] = allocated_claim(
        "team-a", "web-0-dev-x", "claim-uid", "web-0", "pod-uid", []
    )
    client = api.client()
    async with asyncio.timeout(30):
        got = await claims_ahead.measure("unused", NODE, 1, 0.3, client=client)
    assert got["claims_kept"] == 1 and got["claims_read"] == 1
    assert got["startup_requests"] == {
        "get namespaces": 1,
        "get resourceclaims": 1,
        "watch pods": 1,
    }
    assert api.watches == 1
    assert got["rest_requests_per_min"] == 0.0 and got["rest_by_kind"] == {}
    assert got["held_kib"] > 0 and got["held_bytes_per_claim"] > 0
    assert got["kib"]["rest"]["VmRSS"] >= got["kib"]["rest"]["RssAnon"] > 0
