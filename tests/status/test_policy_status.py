"""Issue 43's writes off the hook path: the claim's NetworkPolicyEnforced condition merged into
its status.devices entry whichever comes first, and a policy's problems on this node written as
its status entry of this node (server-side apply, one field manager per node; an empty list
removes the entry) with an Event for a new problem; a 404 (a policy gone, or a CRD without the
status subresource) is dropped, a transient failure retried."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from cnidra.api.constants import CONDITION_POLICY, CONDITION_READY
from cnidra.api.refs import ObjectRef
from cnidra.kube.api import Api
from cnidra.kube.events import EventRecorder, Involved
from cnidra.kube.session import ApiStatus
from cnidra.status.devices import Condition, DeviceStatus, policy_condition
from cnidra.status.events import EventWriter
from cnidra.status.netpolicy import (
    EVENT_NOT_APPLIED,
    EVENT_NOT_ENFORCED,
    NOT_APPLIED,
    PolicyRef,
    PolicyStatusWriter,
    entry_of,
    status_body,
)
from cnidra.status.writer import StatusWriter
from cnidra.util.backoff import Backoff
from cnidra.util.workqueue import Lane, WorkQueue
from tests.status.test_network_status import running

CLAIM = ObjectRef("ns", "c", "c-uid")
READY = Condition(CONDITION_READY, "True", "r", "m", "2026-11-28T00:00:00Z")
DEVICE = DeviceStatus("node", "eth1", "", (READY,))


class Patches:
    """Records each patch; `failing`: what the next patches raise, in order."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
        self.failing: list[Exception] = []
        self.called = asyncio.Event()

    async def patch(self, kind: Any, name: str, body: dict[str, Any], **kwargs: Any) -> None:
        self.called.set()
        if self.failing:
            raise self.failing.pop(0)
        self.patches.append((name, body, kwargs))


async def settled(check: Any) -> None:
    """Until `check()` holds (at most 30 s: a bound for a hang, not for a slow machine)."""
    for _ in range(3000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not settled within 30 s")


async def test_the_condition_is_merged_into_the_entry_whichever_comes_first() -> None:
    client = Patches()
    writer = StatusWriter(client)  # type: ignore[arg-type]
    condition = policy_condition("net1", "ns/blue")
    async with running(writer):
        writer.device_condition(CLAIM, DEVICE.key, CONDITION_POLICY, condition)
        await asyncio.sleep(0.05)
        assert client.patches == []  # no entry yet: nothing to write
        writer.put(CLAIM, DEVICE)
        await settled(lambda: len(client.patches) == 1)
        [entry] = client.patches[0][1]["status"]["devices"]
        assert [c["type"] for c in entry["conditions"]] == [CONDITION_READY, CONDITION_POLICY]
        # the same condition again (a later time): not written again
        writer.device_condition(
            CLAIM, DEVICE.key, CONDITION_POLICY, replace(condition, last_transition_time="later")
        )
        await asyncio.sleep(0.05)
        assert len(client.patches) == 1
        # changed: written; the entry put again keeps it
        undoable = policy_condition("net1", "ns/blue", undoable_by=["c"])
        writer.device_condition(CLAIM, DEVICE.key, CONDITION_POLICY, undoable)
        writer.put(CLAIM, DEVICE)
        await settled(lambda: len(client.patches) == 2)
        [entry] = client.patches[1][1]["status"]["devices"]
        assert entry["conditions"][1]["status"] == "False"
        # the entry dropped: its condition with it
        writer.drop(CLAIM, [DEVICE.key])
        await settled(lambda: len(client.patches) == 3)
        assert client.patches[2][1]["status"]["devices"] == []
        assert writer.claims.conditions == {}


def test_the_status_body_holds_this_nodes_entry_or_none() -> None:
    ref = PolicyRef("MultiNetworkPolicy", "deny", "ns")
    body = status_body(ref, "node-1", ["pod ns/a net1 (ns/blue): why"])
    assert body["apiVersion"] == "k8s.cni.cncf.io/v1beta1"
    assert body["metadata"] == {"name": "deny", "namespace": "ns"}
    [entry] = body["status"]["nodes"]
    [cond] = entry["conditions"]
    assert entry["node"] == "node-1"
    assert (cond["type"], cond["status"], cond["reason"]) == ("Enforced", "False", "NotEnforceable")
    assert cond["message"] == "not enforced on pod ns/a net1 (ns/blue): why"
    admin = status_body(PolicyRef("CNIAdminNetworkPolicy", "mgmt"), "node-1", [])
    assert admin["metadata"] == {"name": "mgmt"} and admin["status"] == {"nodes": []}
    many = status_body(ref, "n", [f"p{i}" for i in range(25)])
    assert many["status"]["nodes"][0]["conditions"][0]["message"].endswith("and 5 more")
    assert entry_of(body, "node-1") and not entry_of(body, "node-2") and not entry_of({}, "x")


def on_status_queue(api: Api, node: str, events: Any) -> tuple[PolicyStatusWriter, StatusWriter]:
    """A node's policy reports as the driver wires them: on the status writer's one queue,
    written by its worker."""
    status = StatusWriter(None)
    writer = PolicyStatusWriter(api, node, events, lane=status.lane("policy"), wake=status.wake)
    status.join(writer)
    return writer, status


async def test_a_policys_problems_are_written_as_this_nodes_entry_with_an_event() -> None:
    client = Patches()
    events: list[tuple[Involved, str, str]] = []
    writer, status = on_status_queue(
        Api(client), "node-1", lambda about, reason, msg, *_: events.append((about, reason, msg))
    )
    ref = PolicyRef("MultiNetworkPolicy", "deny", "ns")
    task = asyncio.create_task(status.run())
    try:
        writer.report(ref, ["pod ns/a net1 (ns/blue): why"])
        await settled(lambda: len(client.patches) == 1)
        name, _, kwargs = client.patches[0]
        assert name == "deny" and kwargs["field_manager"] == "cnidra-netpolicy-node-1"
        assert kwargs["namespace"] == "ns" and kwargs["force"] is True
        [(about, reason, message)] = events
        assert (about.kind, about.name, about.namespace) == ("MultiNetworkPolicy", "deny", "ns")
        assert about.api_version == "k8s.cni.cncf.io/v1beta1"
        assert reason == EVENT_NOT_ENFORCED and "node node-1" in message
        # the same again: nothing; a transient failure: retried
        writer.report(ref, ["pod ns/a net1 (ns/blue): why"])
        client.failing = [ApiStatus(503, "busy")]
        writer.report(ref, [])
        await settled(lambda: len(client.patches) == 2)
        assert client.patches[1][1]["status"] == {"nodes": []}  # the entry removed
        assert len(events) == 1 and writer.wanted == {} and writer.pending() == 0
        # a policy whose CRD has no status subresource (404): dropped, the Event stays
        client.failing = [ApiStatus(404, "not found")]
        writer.report(PolicyRef("CNIAdminNetworkPolicy", "mgmt"), ["x"])
        await settled(lambda: writer.pending() == 0 and not client.failing)
        assert len(events) == 2 and writer.wanted == {}
    finally:
        task.cancel()


class Events:
    """One apiserver's Events, by name: a create of a name it holds answers 409 AlreadyExists
    (a generated name is made unique, as the apiserver does)."""

    def __init__(self) -> None:
        self.objects: dict[str, Any] = {}

    async def create(self, kind: Any, obj: Any, **_: Any) -> Any:
        meta = obj["metadata"]
        name = meta.get("name") or f"{meta['generateName']}{len(self.objects)}"
        if name in self.objects:
            raise ApiStatus(409, f'events "{name}" already exists')
        self.objects[name] = obj
        return obj


def node_writer(node: str, client: Events) -> tuple[PolicyStatusWriter, EventWriter]:
    """A node's policy reports as the driver wires them: their Events through an EventWriter."""
    queue: WorkQueue[tuple[str, Any]] = WorkQueue(lambda: Backoff(0.01, 0.1))
    events = EventWriter(
        Api(client), EventRecorder("cnidra", node), Lane(queue, "events"), lambda: None
    )
    return PolicyStatusWriter(None, node, events.object_event), events


async def test_a_refusal_reported_by_every_node_is_one_event_and_each_nodes_entry() -> None:
    """Every node judges a refused policy alike: N nodes give one Event (named alike, the
    others' creates answer 409 and are taken as written), not N; each node keeps its entry.
    A NotEnforced problem is the node's own: one Event per node."""
    client = Events()
    ref = PolicyRef("MultiNetworkPolicy", "db", "tenant-c")
    why = "cninetwork:data: pods of tenant-c may not use it"
    writers = [node_writer(f"node-{i}", client) for i in (1, 2, 3)]
    for reports, events in writers:
        reports.report(ref, [NOT_APPLIED + why])
        await events._send()
        assert events.pending() == 0  # written, or found written: not retried
    [event] = client.objects.values()
    assert event["reason"] == EVENT_NOT_APPLIED and event["type"] == "Warning"
    assert why in event["message"] and "node-" not in event["message"]
    assert event["metadata"]["name"].startswith("db.") and event["reportingInstance"] == "node-1"
    bodies = [status_body(ref, r.node, r.wanted[ref]) for r, _ in writers]
    assert [b["status"]["nodes"][0]["node"] for b in bodies] == ["node-1", "node-2", "node-3"]
    assert {b["status"]["nodes"][0]["conditions"][0]["reason"] for b in bodies} == {"NotApplied"}
    # another reason of the same policy is another Event; a node's interfaces, one per node
    for reports, events in writers[:2]:
        reports.report(ref, [NOT_APPLIED + "it does not decode"])
        reports.report(ref, ["pod tenant-c/a net1 (data): userspace"])
        await events._send()
    reasons = sorted(e["reason"] for e in client.objects.values())
    assert reasons == [EVENT_NOT_APPLIED, EVENT_NOT_APPLIED, EVENT_NOT_ENFORCED, EVENT_NOT_ENFORCED]


async def test_a_conflict_on_a_generated_name_is_still_retried() -> None:
    """Only a named Event's 409 means another node wrote it."""

    class Busy(Events):
        async def create(self, kind: Any, obj: Any, **_: Any) -> Any:
            raise ApiStatus(409, "conflict")

    _, events = node_writer("node-1", Busy())
    events.object_event(Involved("Pod", "p", "ns"), "Reason", "message")
    await events._send()
    assert events.pending() == 1 and events.queue[0].attempts == 1
