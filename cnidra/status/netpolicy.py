"""Network policy's reports on the policy objects (issue 43), written off the NRI hook's path:
a policy that selects an interface on this node where it cannot be enforced (a plugin type with
no kernel path, a device bound to a userspace driver) gets a Warning Event and an entry of this
node in its `status.nodes`, with an `Enforced` condition False naming the interfaces and why. A
policy the driver does not apply at all (it does not decode, or a tenant's names a network its
namespace may not use: the tenancy rule) is reported the same way, its problem a line starting
with `NOT_APPLIED`: the condition's reason is then `NotApplied` and the Event's
`NetworkPolicyNotApplied`, so the two cases are told apart without a second channel.

Each node writes only its own entry (`status.nodes` is a map keyed by `node`; server-side apply,
one field manager per node, `cnidra-netpolicy-<node>`), as Gateway API's route status has one
entry per controller: no node overwrites another's, and a node whose problems are gone applies
an empty list, which removes its entry and only its entry. A node with nothing to report never
writes: a policy enforced everywhere has no `status.nodes` at all.

A refusal is judged alike by every node (the policy and the cluster, not the node's pods), so
its Event is the cluster's, not each node's: every node gives it the same name (the policy, the
reason and the message, hashed) and a message that names no node; the first node's create makes
it, the others' answer 409 (taken as written), and N nodes give one Event, not N. Its
`reportingInstance` is the node that wrote first. Each node still writes its own `status.nodes`
entry, which says which nodes refuse it. A NotEnforced Event names the node's own interfaces:
one per node, as before.

The producers (`report`) never block and never fail; the status writer's one worker writes
(its queue's `policy` lane) with a timeout per call and retries with backoff. A policy that
is gone, or a CRD without the status subresource (Multus' own MultiNetworkPolicy CRD has
none), answers 404: the Event is then all there is."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from cnidra.api.netpolicy import ADMIN_API_VERSION, MNP_API_VERSION, MNP_KIND
from cnidra.kube.api import Api, RefusedForGood
from cnidra.kube.events import Involved
from cnidra.kube.netpolicy import CNIAdminNetworkPolicy, MultiNetworkPolicy
from cnidra.util.workqueue import Lane, WorkQueue

log = logging.getLogger(__name__)

CONDITION_ENFORCED = "Enforced"
REASON_NOT_ENFORCEABLE = "NotEnforceable"
REASON_NOT_APPLIED = "NotApplied"
EVENT_NOT_ENFORCED = "NetworkPolicyNotEnforced"
EVENT_NOT_APPLIED = "NetworkPolicyNotApplied"
NOT_APPLIED = "not applied: "  # a problem line of a policy the driver refused
REQUEST_TIMEOUT = 10.0
MESSAGE_MAX = 32768
MAX_LISTED = 20  # interfaces named in one condition; beyond, counted


@dataclass(frozen=True, order=True)
class PolicyRef:
    """A policy object: a tenant's MultiNetworkPolicy (namespaced) or an admin's
    CNIAdminNetworkPolicy (cluster-scoped, namespace "")."""

    kind: str
    name: str
    namespace: str = ""

    @property
    def involved(self) -> Involved:
        version = MNP_API_VERSION if self.kind == MNP_KIND else ADMIN_API_VERSION
        return Involved(self.kind, self.name, self.namespace, api_version=version)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else f"admin/{self.name}"


class EventSink(Protocol):
    """Where the Events go (`StatusWriter.object_event`); `name`: see `cluster_event_name`."""

    def __call__(
        self, about: Involved, reason: str, message: str, type_: str = ..., name: str = ...
    ) -> None: ...


def cluster_event_name(ref: PolicyRef, reason: str, message: str) -> str:
    """The name every node gives an Event about `ref` with this reason and message: the
    policy's name (as the apiserver's generated names start) and a digest of the rest. A
    refusal that comes back with the same message while the first Event lives (the
    apiserver's TTL, an hour by default) is not told again; the status entries are current."""
    digest = hashlib.sha256("\0".join((str(ref), ref.kind, reason, message)).encode())
    return f"{ref.name[:200]}.{digest.hexdigest()[:16]}"


def node_entry(node: str, problems: Sequence[str], now: datetime | None = None) -> dict[str, Any]:
    """This node's `status.nodes` entry for `problems` (one line per interface): its
    `Enforced` condition, False, naming the interfaces (at most MAX_LISTED, then counted); or,
    for a policy not applied (its lines start with NOT_APPLIED), saying why."""
    refused = [p for p in problems if p.startswith(NOT_APPLIED)]
    problems = [p for p in problems if not p.startswith(NOT_APPLIED)]
    listed = list(problems[:MAX_LISTED])
    if len(problems) > MAX_LISTED:
        listed.append(f"and {len(problems) - MAX_LISTED} more")
    message = "; ".join(refused) or "not enforced on " + "; ".join(listed)
    if len(message) > MESSAGE_MAX:
        message = message[: MESSAGE_MAX - 3] + "..."
    stamp = (now or datetime.now(UTC)).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "node": node,
        "conditions": [
            {
                "type": CONDITION_ENFORCED,
                "status": "False",
                "reason": REASON_NOT_APPLIED if refused else REASON_NOT_ENFORCEABLE,
                "message": message,
                "lastTransitionTime": stamp,
            }
        ],
    }


def status_body(ref: PolicyRef, node: str, problems: Sequence[str]) -> dict[str, Any]:
    """What this node applies to the policy's status subresource: its entry, or none (which
    removes the entry it applied before)."""
    metadata = {"name": ref.name, **({"namespace": ref.namespace} if ref.namespace else {})}
    api_version = MNP_API_VERSION if ref.kind == MNP_KIND else ADMIN_API_VERSION
    nodes = [node_entry(node, problems)] if problems else []
    return {
        "apiVersion": api_version,
        "kind": ref.kind,
        "metadata": metadata,
        "status": {"nodes": nodes},
    }


def entry_of(obj: Any, node: str) -> bool:
    """Whether a policy object (a dict) holds an entry of `node` in `status.nodes`."""
    status = obj.get("status") if isinstance(obj, dict) else None
    nodes = status.get("nodes") if isinstance(status, dict) else None
    return isinstance(nodes, list) and any(
        isinstance(n, dict) and n.get("node") == node for n in nodes
    )


class PolicyStatusWriter:
    """Queues each policy's problems on this node and writes them (`write_due`, called by the
    status writer's worker).
    `events`: where the Events go (the status writer's queue, `StatusWriter.object_event`)."""

    def __init__(
        self,
        api: Api | None,
        node: str,
        events: EventSink | None = None,
        *,
        lane: Lane[PolicyRef] | None = None,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        """`lane`: its share of the status writer's one queue (`StatusWriter.lane`), whose
        worker calls `write_due`; `wake`: that worker's wake-up. Alone (no lane: a queue of its
        own), `write_due` is the caller's to call."""
        self.api = api
        self.node = node
        self.events = events
        self.manager = f"cnidra-netpolicy-{node}"
        self.wanted: dict[PolicyRef, tuple[str, ...]] = {}
        self.written: dict[PolicyRef, tuple[str, ...]] = {}
        self.lane: Lane[PolicyRef] = Lane(WorkQueue(), "policy") if lane is None else lane
        self.wake = wake

    def report(self, ref: PolicyRef, problems: Sequence[str], *, event: bool = True) -> None:
        """The policy's problems on this node now (empty: none). A problem not reported before
        gets an Event (unless `event` is False)."""
        problems = tuple(sorted(problems))
        before = self.wanted.get(ref, ())
        if problems == before and ref in self.wanted:
            return
        self.wanted[ref] = problems
        new = [p for p in problems if p not in before]
        refused = [p for p in new if p.startswith(NOT_APPLIED)]
        if refused and event and self.events is not None:
            message = (
                f"policy {ref} is not applied (every node judges alike; the nodes that refuse "
                "it are in its status.nodes): "
                + "; ".join(p.removeprefix(NOT_APPLIED) for p in refused)
            )
            name = cluster_event_name(ref, EVENT_NOT_APPLIED, message)
            self.events(ref.involved, EVENT_NOT_APPLIED, message, "Warning", name)
        new = [p for p in new if not p.startswith(NOT_APPLIED)]
        if new and event and self.events is not None:
            self.events(
                ref.involved,
                EVENT_NOT_ENFORCED,
                f"policy {ref} selects interfaces on node {self.node} where it cannot be "
                f"enforced: {'; '.join(new[:MAX_LISTED])}",
            )
        self.lane.add(ref)
        self.wake()

    def pending(self) -> int:
        return len(self.lane)

    async def write(self, ref: PolicyRef) -> None:
        problems = self.wanted.get(ref, ())
        if self.written.get(ref) == problems and ref in self.written:
            return
        if self.api is not None:
            kind = MultiNetworkPolicy if ref.kind == MNP_KIND else CNIAdminNetworkPolicy
            await self.api.apply(
                kind.Status,
                ref.name,
                status_body(ref, self.node, problems),
                namespace=ref.namespace or None,
                field_manager=self.manager,
                within=REQUEST_TIMEOUT,
            )
        self.written[ref] = problems
        if not problems:  # nothing left to say about it here
            self.wanted.pop(ref, None)
            self.written.pop(ref, None)

    async def write_due(self) -> None:
        """Each policy due on its own backoff (the status writer's worker calls this)."""
        for ref in self.lane.due():
            try:
                await self.write(ref)
            except asyncio.CancelledError:
                raise
            except RefusedForGood as exc:  # gone, or a CRD without status: the Event stays
                log.info("status of %s %s not written: %s", ref.kind, ref, exc)
                self.wanted.pop(ref, None)
                self.written.pop(ref, None)
            except Exception as exc:
                delay = self.lane.retry(ref)
                log.warning(
                    "status of %s %s not written (%s); retry in %.1fs", ref.kind, ref, exc, delay
                )
                continue
            self.lane.done(ref)
