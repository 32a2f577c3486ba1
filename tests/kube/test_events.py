"""The one Event recorder: every kind's Events carry the fields kubelet's do, the IPAMClaims'
included (they showed `<unknown>` times in `kubectl get events`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from cnidra.kube.api import Api
from cnidra.kube.events import EventRecord, EventRecorder, Involved
from cnidra.kube.ipam import KubeIPAM
from cnidra.status.writer import StatusWriter


class Created:
    def __init__(self) -> None:
        self.objects: list[Any] = []

    async def create(self, kind: Any, obj: Any, **_: Any) -> Any:
        assert kind.kind == "Event"
        self.objects.append(obj)
        return obj


def fields(event: Any) -> dict[str, Any]:
    data: dict[str, Any] = event
    return data


@pytest.mark.parametrize(
    ("about", "api_version", "namespace"),
    [
        (Involved("Pod", "p", "ns", "uid-p"), "v1", "ns"),
        (Involved("ResourceClaim", "c", "ns", "uid-c"), "resource.k8s.io/v1", "ns"),
        (Involved("Node", "node-a"), "v1", "default"),  # cluster-scoped: the default namespace
    ],
)
def test_an_event_carries_kubelets_fields(
    about: Involved, api_version: str, namespace: str
) -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    event = EventRecorder("cnidra", "node-a").build(
        EventRecord(about, "AddedInterface", "x" * 2000, "Normal", at)
    )
    data = fields(event)
    assert data["metadata"] == {"generateName": f"{about.name}.", "namespace": namespace}
    involved = data["involvedObject"]
    assert involved["kind"] == about.kind and involved["apiVersion"] == api_version
    assert involved["name"] == about.name
    assert involved.get("namespace") == (about.namespace or None)
    assert involved.get("uid") == (about.uid or None)
    assert data["firstTimestamp"] == data["lastTimestamp"] == "2026-01-02T03:04:05.000006Z"
    assert data["count"] == 1
    assert data["source"] == {"component": "cnidra", "host": "node-a"}
    assert (data["reportingComponent"], data["reportingInstance"]) == ("cnidra", "node-a")
    assert len(data["message"]) == 1024
    assert (data["reason"], data["type"]) == ("AddedInterface", "Normal")
    assert "eventTime" not in data  # a core/v1 Event as kubelet's: see cnidra.kube.events


async def test_an_ipamclaims_event_has_times_its_node_and_the_objects_version() -> None:
    api = Created()
    ipam = KubeIPAM(api, node="node-a")  # type: ignore[arg-type]
    claim = {
        "metadata": {"name": "keep", "namespace": "ns", "uid": "uid-k", "resourceVersion": "7"}
    }
    before = datetime.now(UTC)
    await ipam.record(claim, "AddressesAllocated", "10.0.0.5/24 on node-a")
    [event] = api.objects
    first = datetime.fromisoformat(event["firstTimestamp"].replace("Z", "+00:00"))
    assert before <= first
    assert event["firstTimestamp"] == event["lastTimestamp"] and event["count"] == 1
    involved = event["involvedObject"]
    assert (involved["kind"], involved["apiVersion"]) == ("IPAMClaim", "k8s.cni.cncf.io/v1alpha1")
    assert (involved["name"], involved["namespace"], involved["uid"]) == ("keep", "ns", "uid-k")
    assert involved["resourceVersion"] == "7"
    assert event["source"]["host"] == "node-a" and event["reportingInstance"] == "node-a"


async def test_the_recorder_sends_through_the_one_layer() -> None:
    api = Created()
    await EventRecorder().send(Api(api), EventRecord(Involved("Pod", "p", "ns"), "R", "m"))
    [event] = api.objects
    assert event["reportingComponent"] == "cnidra" and "reportingInstance" not in event


async def test_the_drivers_ipam_events_go_through_the_status_writers_queue() -> None:
    """As the driver wires it: an IPAMClaim's Normal Event and the accountant's Warning go to
    the status writer's one queue (bounded, retried, `--normal-events` obeyed), not straight to
    the apiserver; written by its worker with the one recorder's fields."""
    api = Created()
    status = StatusWriter(api, node="node-a", normal_events="added")  # type: ignore[arg-type]
    ipam = KubeIPAM(api, node="node-a", events=status.object_event)  # type: ignore[arg-type]
    claim = {"metadata": {"name": "keep", "namespace": "ns", "uid": "uid-k"}}
    await ipam.record(claim, "AddressesKept", "kept")
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "uid-p"}}
    await ipam.warn("Pod", pod, "PoolExhausted", "no address left")
    assert api.objects == [] and status.pending() == 2  # queued, not sent
    await status.events.write_due()
    assert [(e["reason"], e["type"]) for e in api.objects] == [
        ("AddressesKept", "Normal"),
        ("PoolExhausted", "Warning"),
    ]
    assert all(e["reportingInstance"] == "node-a" and e["firstTimestamp"] for e in api.objects)
    quiet = StatusWriter(api, node="node-a", normal_events="none")  # type: ignore[arg-type]
    silent = KubeIPAM(api, events=quiet.object_event)  # type: ignore[arg-type]
    await silent.record(claim, "AddressesKept", "kept")
    assert quiet.pending() == 0  # a Normal Event as --normal-events=none says: not written
