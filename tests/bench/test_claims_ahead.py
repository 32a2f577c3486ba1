"""bench.claims_ahead's parts without a control plane: the deep size of what the read-ahead
holds, the request log and the per-minute figure (bench.fleet runs the whole at 1,000 nodes)."""

from __future__ import annotations

import sys

import httpx2

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

    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, json={})

    async with httpx2.AsyncClient(
        transport=httpx2.MockTransport(answer),
        base_url="https://127.0.0.1:1",
        event_hooks={"request": [log.record]},
    ) as http:
        await http.get("/api/v1/pods?watch=true&fieldSelector=spec.nodeName%3Dn")
        await http.get("/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c")
    kinds = [k for _, k in log.entries]
    assert kinds == ["watch pods", "get resourceclaims"]
    assert sum(log.between(0.0, float("inf")).values()) == 2
    assert not log.between(0.0, log.entries[0][0])


def test_per_minute() -> None:
    assert claims_ahead.per_minute(3, 30.0) == 6.0
    assert claims_ahead.kib_to_mib(1536) == 1.5
