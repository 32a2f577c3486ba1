"""A pod's networks as the node knows them, from the checkpoint, the sandbox records and the
journal alone: what `cnidra node` shows and the node API serves. Pure: no I/O, no apiserver."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cnidra._proto.node.v1alpha1 import api_pb2 as api
from cnidra.cni.attach import Attachment
from cnidra.cni.errors import CNIRuntimeError
from cnidra.cni.result import Result
from cnidra.datapath import shaping
from cnidra.state import journal as events
from cnidra.state.checkpoint import PreparedClaim
from cnidra.state.journal import Entry
from cnidra.state.sandboxes import Attached, SandboxRecord, State
from cnidra.status.devices import network_data_of

EVENTS_PER_POD = 20
STATES = {State.ADDED: "attached", State.ADDING: "adding", State.DELETING: "deleting"}


@dataclass(frozen=True)
class NodeRecords:
    claims: tuple[PreparedClaim, ...]
    sandboxes: tuple[SandboxRecord, ...]
    journal: tuple[Entry, ...]


def pod_networks(records: NodeRecords, namespace: str = "") -> list[api.PodNetwork]:
    uids: dict[str, None] = {}
    for record in records.sandboxes:
        uids.setdefault(record.pod.uid)
    for claim in records.claims:
        for uid in claim.pod_uids:
            uids.setdefault(uid)
    views = [pod_network(records, uid) for uid in uids]
    views = [v for v in views if not namespace or v.pod.namespace == namespace]
    return sorted(views, key=lambda v: (v.pod.namespace, v.pod.name, v.pod.uid))


def find_pod(records: NodeRecords, namespace: str, name: str, uid: str) -> api.PodNetwork | None:
    if uid:
        known = {r.pod.uid for r in records.sandboxes} | {
            u for c in records.claims for u in c.pod_uids
        }
        return pod_network(records, uid) if uid in known else None
    for view in pod_networks(records, namespace):
        if view.pod.name == name:
            return view
    return None


def pod_network(records: NodeRecords, uid: str) -> api.PodNetwork:
    sandboxes = [r for r in records.sandboxes if r.pod.uid == uid]
    # the live one: attached, else the newest write-ahead state
    record = next((r for r in sandboxes if r.state is State.ADDED), None) or (
        sandboxes[-1] if sandboxes else None
    )
    claims = [c for c in records.claims if uid in c.pod_uids]
    history = [e for e in records.journal if e.pod_uid == uid]
    pod = _pod_ref(uid, record, history, claims)
    view = api.PodNetwork(
        pod=pod,
        claims=[
            api.ClaimRef(namespace=c.ref.namespace, name=c.ref.name, uid=c.ref.uid) for c in claims
        ],
        events=[event_of(e) for e in history[-EVENTS_PER_POD:]],
    )
    if record is not None:
        view.sandbox_id = record.sandbox_id
        view.netns = record.netns
        view.state = STATES[record.state]
        view.attachments.extend(_attachment(a, view.state) for a in record.attachments)
    else:
        view.state = "prepared"
        view.attachments.extend(
            _attachment(Attached(d), "prepared") for c in claims for d in c.devices
        )
    view.problem = _problem(view.state, history)
    return view


def _pod_ref(
    uid: str, record: SandboxRecord | None, history: list[Entry], claims: list[PreparedClaim]
) -> api.PodRef:
    if record is not None:
        return api.PodRef(namespace=record.pod.namespace, name=record.pod.name, uid=uid)
    if history:  # a pod with no record yet is named by its journal, if anything happened
        return api.PodRef(namespace=history[-1].pod_namespace, name=history[-1].pod_name, uid=uid)
    # else only its namespace is known: a pod uses claims of its own namespace
    return api.PodRef(namespace=claims[0].ref.namespace if claims else "", uid=uid)


def _problem(state: str, history: list[Entry]) -> str:
    last = history[-1] if history else None
    if state == "attached":
        return ""
    if state == "deleting":
        failed = next((e for e in reversed(history) if e.kind == events.DETACH_FAILED), None)
        why = f": {failed.message}" if failed else ""
        return f"interfaces are being removed and DEL is retried{why}"
    if state == "adding":
        return "ADD is in progress (or was cut short: the next Synchronize undoes it)"
    if last is not None and last.kind == events.ATTACH_FAILED:
        return f"attach failed: {last.message}"
    if last is not None and last.kind in (events.DETACHED, events.SWEPT):
        return f"the last sandbox's interfaces were removed ({last.message}); no new sandbox yet"
    return (
        "prepared, but no sandbox of this pod has been attached yet (its sandbox has not "
        "started, or cnidra was not connected to the runtime: the next Synchronize attaches it)"
    )


def _attachment(attached: Attached, state: str) -> api.Attachment:
    att: Attachment = attached.attachment
    out = api.Attachment(
        claim=api.ClaimRef(namespace=att.claim.namespace, name=att.claim.name, uid=att.claim.uid),
        request=att.request,
        if_name=att.if_name,
        network=att.network_label,
        cni_network=str(att.network.get("name", "")),
        pool=att.pool,
        device=att.device,
        parent=att.parent,
        plugins=list(_plugin_types(att)),
        state=state,
        share_id=att.share_id or "",
    )
    if att.rate is not None:
        out.reserved.rate_bps = att.rate.rate
        out.reserved.ceil_bps = att.rate.ceil
        if att.bandwidth is not None and att.bandwidth.granted is None:
            out.held_as = "leftover" if att.bandwidth.rules.shares_leftover else "class"
    if attached.result is not None:
        out.cni_result_json = json.dumps(attached.result, sort_keys=True)
        try:
            data, _ = network_data_of(Result(attached.result), att.if_name)
        except (CNIRuntimeError, ValueError, KeyError, TypeError):
            data = {}
        out.ips.extend(data.get("ips", []))
        out.mac = data.get("hardwareAddress", "")
    return out


def shaped_names(view: api.PodNetwork) -> list[str]:
    """The pod's attached interfaces that hold a rate limit (whose enforcement is read)."""
    if view.state != "attached" or not view.netns:
        return []
    return [a.if_name for a in view.attachments if a.state == "attached" and a.HasField("reserved")]


def add_enforced(
    view: api.PodNetwork, found: Mapping[str, shaping.Shaping] | None, error: str = ""
) -> None:
    """What each shaped interface holds now (`found`, by name, from shaping.read_many), or
    why it could not be read."""
    for att in view.attachments:
        if att.if_name not in shaped_names(view):
            continue
        shaped = (found or {}).get(att.if_name)
        if shaped is None:
            att.enforced.error = error or "no limit found on the interface"
            continue
        for name in ("egress", "ingress"):
            direction: shaping.Direction | None = getattr(shaped, name)
            if direction is None:
                continue
            out: api.ShapedDirection = getattr(att.enforced, name)
            out.limit.rate_bps = direction.rate
            out.limit.ceil_bps = direction.ceil
            out.sent_bytes = direction.sent_bytes
            out.sent_packets = direction.sent_packets
            out.drops = direction.drops
            out.overlimits = direction.overlimits
        if not shaped.complete:
            att.enforced.error = "the limit is there in one direction only"


def _plugin_types(att: Attachment) -> Iterable[str]:
    plugins = att.network.get("plugins")
    if isinstance(plugins, list):
        return [str(p.get("type", "")) for p in plugins if isinstance(p, dict)]
    return [str(att.network.get("type", ""))]


def event_of(entry: Entry) -> api.Event:
    return api.Event(
        seq=entry.seq,
        time=entry.time,
        kind=entry.kind,
        pod=api.PodRef(namespace=entry.pod_namespace, name=entry.pod_name, uid=entry.pod_uid),
        sandbox_id=entry.sandbox_id,
        message=entry.message,
        duration_ms=entry.duration_ms,
    )
