"""One pod's or one claim's permanent failure never stops the others; every queue is bounded;
a tenant's network-status annotation is read with bounds (issue 26)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

from cnidra.api.refs import ObjectRef
from cnidra.kube.session import ApiStatus
from cnidra.status import events
from cnidra.status import writer as module
from cnidra.status.writer import NETWORK_STATUS_ANNOTATION, StatusWriter
from tests.status.test_network_status import OURS, running


def refusal(code: int, message: str = "refused") -> ApiStatus:
    return ApiStatus(code, message)


class Pods:
    """Many pods; `failing` maps a pod name to what its patches raise."""

    def __init__(self, **annotations: str) -> None:
        self.annotations = {name: {NETWORK_STATUS_ANNOTATION: v} for name, v in annotations.items()}
        self.failing: dict[str, Exception] = {}
        self.patched: dict[str, int] = {}
        self.events: list[str] = []
        self.event_failures: dict[str, Exception] = {}
        self.event_calls = 0
        self.objects: list[dict[str, Any]] = []

    async def get(self, resource: Any, name: str, namespace: str) -> dict[str, Any]:
        meta = {"name": name, "namespace": namespace, "uid": f"uid-{name}", "resourceVersion": "1"}
        meta["annotations"] = dict(self.annotations.get(name, {}))
        return {"metadata": meta}

    async def patch(self, resource: Any, name: str, body: dict[str, Any], **_: Any) -> None:
        self.patched[name] = self.patched.get(name, 0) + 1
        if name in self.failing:
            raise self.failing[name]
        self.annotations.setdefault(name, {}).update(body["metadata"]["annotations"])

    async def create(self, kind: Any, event: dict[str, Any]) -> None:
        self.event_calls += 1
        assert kind.kind == "Event" and event["reason"] is not None
        if event["reason"] in self.event_failures:
            raise self.event_failures[event["reason"]]
        self.events.append(event["reason"])
        self.objects.append(event)

    def entries(self, name: str) -> list[dict[str, Any]]:
        loaded: list[dict[str, Any]] = json.loads(self.annotations[name][NETWORK_STATUS_ANNOTATION])
        return loaded


def pod(name: str) -> ObjectRef:
    return ObjectRef("ns", name, f"uid-{name}")


async def settle(writer: StatusWriter, within: float = 30.0) -> None:  # a hang's bound
    async with asyncio.timeout(within):
        await writer.flushed()


async def test_one_pod_failing_does_not_hold_up_the_others() -> None:
    api = Pods()
    api.failing["stuck"] = ConnectionError("apiserver busy for this one")
    api.failing["forbidden"] = refusal(403, "namespace is being terminated")
    writer = StatusWriter(api)  # type: ignore[arg-type]
    async with running(writer):
        for name in ("stuck", "forbidden", "a", "b"):
            writer.pod_networks(pod(name), [OURS])
        for _ in range(1500):  # the others written, whatever "stuck" does meanwhile
            if {"a", "b"} <= set(api.annotations):
                break
            await asyncio.sleep(0.02)
        assert api.entries("a") == [OURS.entry()] and api.entries("b") == [OURS.entry()]
        assert api.patched["forbidden"] == 1  # refused for good: dropped, not retried
        assert pod("forbidden") not in writer.pods.networks
        assert pod("stuck") in writer.pods.networks  # still retried, on its own backoff
        del api.failing["stuck"]
        await settle(writer)
    assert api.entries("stuck") == [OURS.entry()] and writer.pending() == 0


async def test_a_tenants_annotation_is_read_with_bounds_never_raised_on() -> None:
    """Nested thousands deep (a RecursionError before), too large, not a list, or with items
    that are not objects: not the spec's format, replaced; no exception reaches the writer."""
    deep = "[" * 5000 + "]" * 5000
    huge = json.dumps([{"name": "x", "interface": "eth9", "pad": "y" * 300_000}])
    mixed = json.dumps([1, "two", {"name": "other", "interface": "eth0"}])
    api = Pods(deep=deep, huge=huge, scalar='"text"', broken="{nope", mixed=mixed)
    writer = StatusWriter(api)  # type: ignore[arg-type]
    async with running(writer):
        for name in ("deep", "huge", "scalar", "broken", "mixed"):
            writer.pod_networks(pod(name), [OURS])
        await settle(writer)
    for name in ("deep", "huge", "scalar", "broken"):
        assert api.entries(name) == [OURS.entry()], name
    assert api.entries("mixed") == [{"name": "other", "interface": "eth0"}, OURS.entry()]


async def test_an_event_refused_for_good_does_not_block_the_next_and_the_queue_is_bounded(
    monkeypatch: Any,
) -> None:
    api = Pods()
    api.event_failures["Refused"] = refusal(403, "namespace is being terminated")
    api.event_failures["Flaky"] = ConnectionError("reset")
    monkeypatch.setattr(module.Backoff, "next", lambda self: 0.01)
    writer = StatusWriter(api)  # type: ignore[arg-type]
    writer.event(pod("a"), "Refused", "m")
    writer.event(pod("a"), "Flaky", "m")
    writer.event(pod("a"), "AttachFailed", "m")
    writer.event(pod("a"), "Added", "m", "Normal")
    async with running(writer):
        await settle(writer)
    assert api.events == ["AttachFailed", "Added"]
    assert api.event_calls == 1 + events.EVENT_ATTEMPTS + 2  # Flaky: a bounded number of tries
    for i in range(events.MAX_EVENTS + 50):  # the apiserver unreachable meanwhile
        writer.event(pod("a"), f"E{i}", "m")
    assert len(writer.events.queue) == events.MAX_EVENTS
    assert writer.events.queue[0].reason == "E50"  # the oldest gave way


async def test_a_finalizer_refused_for_good_is_not_retried_forever() -> None:
    class Refusing:
        def __init__(self) -> None:
            self.patches = 0

        async def patch(self, resource: Any, *args: Any, **kw: Any) -> None:
            self.patches += 1
            if resource.kind == "ResourceClaim" and not resource.subresource:
                raise refusal(409, "Precondition failed: UID in precondition: uid-c")

    api = Refusing()
    writer = StatusWriter(api)  # type: ignore[arg-type]
    claim = ObjectRef("ns", "c", "uid-c")
    async with running(writer):
        writer.finalizer(claim, True)
        await settle(writer)
    assert writer.pending() == 0 and api.patches == 1  # the finalizer once (no status change)


async def test_a_slow_apiserver_call_times_out_and_the_rest_proceed(monkeypatch: Any) -> None:
    monkeypatch.setattr(module, "REQUEST_TIMEOUT", 0.1)

    fine = asyncio.Event()

    class Hanging(Pods):
        async def patch(self, resource: Any, name: str, body: dict[str, Any], **_: Any) -> None:
            if name == "hangs":
                await asyncio.sleep(3600)
            await super().patch(resource, name, body)
            fine.set()

    api = Hanging()
    writer = StatusWriter(api)  # type: ignore[arg-type]
    async with running(writer):
        writer.pod_networks(pod("hangs"), [OURS])
        writer.pod_networks(pod("fine"), [OURS])
        async with asyncio.timeout(30):  # a hang's bound
            await fine.wait()
    assert api.entries("fine") == [OURS.entry()]


async def test_a_claims_normal_event_is_about_the_resourceclaim() -> None:
    api = Pods()
    writer = StatusWriter(api, normal_events="all")  # type: ignore[arg-type]
    writer.claim_event(ObjectRef("ns", "c", "uid-c"), "Prepared", "Prepared on node n")
    async with running(writer):
        await settle(writer)
    [event] = api.objects
    involved = event["involvedObject"]
    assert (involved["kind"], involved["apiVersion"], involved["name"], involved["uid"]) == (
        "ResourceClaim",
        "resource.k8s.io/v1",
        "c",
        "uid-c",
    )
    assert (event["type"], event["reason"]) == ("Normal", "Prepared")


async def test_an_event_carries_when_it_happened_and_where_even_when_sent_late(
    monkeypatch: Any,
) -> None:
    """`kubectl get events` showed cnidra's Events as LAST SEEN "<unknown>", sorted apart from
    kubelet's: they had no timestamps. They carry the time they happened (not the time a retry
    got through) and the node, as kubelet's do."""
    api = Pods()
    api.event_failures["AddedInterface"] = ConnectionError("reset")
    monkeypatch.setattr(module.Backoff, "next", lambda self: 0.2)
    writer = StatusWriter(api, node="node-a")  # type: ignore[arg-type]
    before = datetime.now(UTC)
    writer.event(pod("p"), "AddedInterface", "Add net1", "Normal")
    queued = datetime.now(UTC)
    async with running(writer):
        await asyncio.sleep(0.05)
        del api.event_failures["AddedInterface"]
        await settle(writer)
    [event] = api.objects
    assert event["firstTimestamp"] == event["lastTimestamp"]
    first = datetime.fromisoformat(event["firstTimestamp"].replace("Z", "+00:00"))
    assert before <= first <= queued  # not the retry's time
    assert event["count"] == 1
    assert (event["source"]["component"], event["source"]["host"]) == ("cnidra", "node-a")
    assert (event["reportingComponent"], event["reportingInstance"]) == ("cnidra", "node-a")


async def test_what_the_writer_keeps_goes_with_the_pods() -> None:
    """Issue 27's soak: nothing the writer keeps per pod outlives the pod (which interfaces it
    wrote into a pod's annotation was kept for every pod of the node's life)."""
    api = Pods()
    writer = StatusWriter(api)  # type: ignore[arg-type]
    async with running(writer):
        for i in range(200):
            writer.pod_networks(pod(f"p{i}"), [OURS])
        await settle(writer)
        assert len(writer.pods.written_interfaces) == 200  # needed while the pods run
        for i in range(200):
            writer.pod_gone(pod(f"p{i}"))
    kept = (
        writer.pods.written_interfaces,
        writer.pods.networks,
        writer.queue.backoffs,
        writer.queue,
    )
    assert [len(k) for k in kept] == [0, 0, 0, 0] and writer.pending() == 0
