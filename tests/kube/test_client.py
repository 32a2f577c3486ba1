"""The driver's start-up check of the cluster: a clear message when the apiserver does not
serve resource.k8s.io/v1, and no verdict (start, retry later) when it cannot be asked."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cnidra.kube.client import dra_api_problem
from cnidra.kube.session import ApiStatus


class Answering:
    def __init__(self, error: Exception | None) -> None:
        self.error = error

    async def list(self, resource: Any, **_: Any) -> AsyncIterator[object]:
        if self.error is not None:
            raise self.error
        yield object()


async def test_a_cluster_without_dra_v1_is_named() -> None:
    missing = ApiStatus(404, "the server could not find it")
    problem = await dra_api_problem(Answering(missing))  # type: ignore[arg-type]
    assert problem is not None and "Kubernetes 1.34 or later" in problem


async def test_an_apiserver_that_answers_or_cannot_be_asked_is_no_verdict() -> None:
    assert await dra_api_problem(Answering(None)) is None  # type: ignore[arg-type]
    down = ConnectionRefusedError("connection refused")
    assert await dra_api_problem(Answering(down)) is None  # type: ignore[arg-type]
    forbidden = ApiStatus(403, "forbidden")
    assert await dra_api_problem(Answering(forbidden)) is None  # type: ignore[arg-type]


async def test_transient_answers_are_retried_a_bounded_number_of_times_honouring_retry_after(
    monkeypatch: Any,
) -> None:
    import asyncio

    from cnidra.kube import client as module

    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    answers: list[Exception] = [
        ApiStatus(429, "throttled", 3.0),
        ApiStatus(503, "storage is (re)initializing"),
    ]
    calls = 0

    async def call() -> str:
        nonlocal calls
        calls += 1
        if answers:
            raise answers.pop(0)
        return "ok"

    assert await module.with_retries(call) == "ok"
    assert calls == 3 and slept[0] == 3.0 and 0 < slept[1] <= 0.6

    async def throttled() -> str:
        raise ApiStatus(429, "throttled", 600.0)

    slept.clear()
    with pytest.raises(ApiStatus):
        await module.with_retries(throttled, attempts=3)
    assert slept == [5.0, 5.0]  # capped, and given up after 3 tries

    async def refused() -> str:
        raise ApiStatus(403, "forbidden")

    slept.clear()
    with pytest.raises(ApiStatus):
        await module.with_retries(refused)
    assert slept == []


class ProbeClient:
    """An apiserver for dry-run creates that drops or refuses the fields of disabled gates."""

    def __init__(self, *, drop: set[str] = frozenset(), refuse: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.drop, self.refuse, self.calls = drop, refuse, 0

    async def create(self, kind: Any, obj: Any, dry_run: bool = False) -> Any:
        assert dry_run, "a probe must never store anything"
        assert kind.kind == "ResourceSlice"
        self.calls += 1
        obj = copy.deepcopy(obj)
        device = obj["spec"]["devices"][0]
        for field in self.refuse:
            if device.get(field):
                raise ApiStatus(422, f"spec.devices[0].{field}: Forbidden")
        for field in self.drop:
            device.pop(field, None)
        return obj


async def test_the_probe_finds_which_optional_fields_the_cluster_keeps() -> None:
    from cnidra.kube.client import probe_features

    everything = await probe_features(ProbeClient(), "n1", "d")  # type: ignore[arg-type]
    assert everything.consumable_capacity and everything.device_taints and everything.known
    assert everything.left_out() == []
    dropped = await probe_features(ProbeClient(drop={"taints"}), "n1", "d")  # type: ignore[arg-type]
    assert dropped.consumable_capacity and not dropped.device_taints
    # capacity is older than KEP-5075; the apiserver without it drops allowMultipleAllocations
    older = await probe_features(ProbeClient(drop={"allowMultipleAllocations"}), "n1", "d")  # type: ignore[arg-type]
    assert not older.consumable_capacity
    assert "DRADeviceTaints off" in dropped.left_out()[0]
    client = ProbeClient(refuse={"capacity"})
    refused = await probe_features(client, "n1", "d")  # type: ignore[arg-type]
    assert not refused.consumable_capacity and refused.device_taints and client.calls == 2
