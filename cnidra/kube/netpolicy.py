"""What network policy needs from the apiserver, listed and then watched: MultiNetworkPolicies,
CNIAdminNetworkPolicies, Namespaces (their labels), Pods (their labels, named ports and the
network-status annotation cnidra writes: the peers' addresses on each network) and CNINetworks
(their namespace rules, for the tenancy rule; few, and seldom changed: the inventory's watch of
them only says that something changed, so policy keeps its own). DeviceClasses, which the
tenancy rule reads too, come from the one DeviceClass watch of the driver
(cnidra.kube.deviceclasses). Each kind is a
loop (`follow`; one supervised task runs them all, `follow_all`): list (the whole set,
`replace`), watch (`changed`), and list again whenever the watch ends or fails, after the one
backoff.

Why pods and their annotation: policy needs every pod's labels anyway (one watch of pods), and
the annotation carries the addresses on every network, as cnidra wrote them on the pod's node;
the claims' `status.devices[].networkData` would need a second watch (claims) joined to the
pods through `reservedFor`, and names no network."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from cnidra.api.constants import API_GROUP
from cnidra.api.netpolicy import ADMIN_KIND, ADMIN_PLURAL, MNP_GROUP, MNP_KIND, MNP_PLURAL
from cnidra.kube.api import Api, Namespace, Pod, cluster_wide, namespaced
from cnidra.kube.networks import CNINetwork
from cnidra.util.backoff import Backoff

log = logging.getLogger(__name__)

MultiNetworkPolicy = namespaced(MNP_GROUP, "v1beta1", MNP_KIND, MNP_PLURAL)
CNIAdminNetworkPolicy = cluster_wide(API_GROUP, "v1alpha1", ADMIN_KIND, ADMIN_PLURAL)
RESOURCES: Mapping[str, tuple[Any, bool]] = {  # kind -> (resource, namespaced)
    "MultiNetworkPolicy": (MultiNetworkPolicy, True),
    "CNIAdminNetworkPolicy": (CNIAdminNetworkPolicy, False),
    "Namespace": (Namespace, False),
    "Pod": (Pod, True),
    "CNINetwork": (CNINetwork, False),
}
LIST_TIMEOUT = 60.0
POLICY_KINDS = ("MultiNetworkPolicy", "CNIAdminNetworkPolicy")
# followed only while a policy exists: every pod of the cluster is the costliest watch a node
# holds (each pod's every change, on every node), and without a policy nothing reads them
WHILE_POLICIES = ("Namespace", "Pod")
IDLE_SECONDS = 60.0  # after the last policy went, before the pods' and namespaces' watches stop


class Feed(Protocol):
    def replace(self, kind: str, objects: Sequence[Mapping[str, Any]]) -> None: ...
    def changed(self, kind: str, event: str, obj: Mapping[str, Any]) -> None: ...


def as_dict(obj: Any) -> Mapping[str, Any]:
    """The object as the apiserver sent it ({} for anything that is not an object)."""
    return obj if isinstance(obj, Mapping) else {}


async def follow_all(
    api: Api,
    feed: Feed,
    clock: Callable[[], float] = time.monotonic,
    *,
    idle: float = IDLE_SECONDS,
) -> None:
    """The policies and CNINetworks followed for ever (`follow`); Namespaces and Pods only
    while a policy exists (`PolicyGate`), and for `idle` seconds after the last one went."""
    gate = PolicyGate(feed)

    async def while_policies() -> None:
        while True:
            await gate.wanted.wait()
            tasks = [
                asyncio.ensure_future(follow(api, kind, gate, clock)) for kind in WHILE_POLICIES
            ]
            try:
                await gate.unwanted_for(idle, clock)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            gate.closed()

    always = [follow(api, kind, gate, clock) for kind in RESOURCES if kind not in WHILE_POLICIES]
    await asyncio.gather(*always, while_policies())


class PolicyGate:
    """Between the watches and the enforcer's Feed: Namespaces and Pods are watched only while
    a policy exists. Without one, the feed is told there are none of either (nothing reads
    them: no policy, no table), so the enforcer is synced. When a policy comes, it is held
    back, with every change after it, until both kinds are listed; then the lists go to the
    feed, then what was held, in the order it came: the enforcer never judges a policy against
    pods it does not know yet (which would leave a pod the policy selects open until the
    list). When the last policy goes, the watches stop after `idle` seconds without one
    (`follow_all`), and the feed is told again there are none."""

    def __init__(self, feed: Feed) -> None:
        self.feed = feed
        self.policies: dict[str, set[tuple[str, str]]] = {kind: set() for kind in POLICY_KINDS}
        self.policies_listed: set[str] = set()
        self.wanted = asyncio.Event()  # a policy exists: Namespaces and Pods are followed
        self.open = False  # what comes goes to the feed; else it is held
        self.listed: dict[str, Sequence[Mapping[str, Any]]] = {}  # while opening
        self.held: list[tuple[str, str, Any]] = []  # (event or "replace", kind, what)
        self._none_since: float | None = None
        self._changed = asyncio.Event()

    @staticmethod
    def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
        meta = as_dict(obj.get("metadata"))
        return str(meta.get("namespace") or ""), str(meta.get("name") or "")

    def _any(self) -> bool:
        return any(self.policies.values())

    def replace(self, kind: str, objects: Sequence[Mapping[str, Any]]) -> None:
        if kind in POLICY_KINDS:
            self.policies[kind] = {self._key(o) for o in objects}
            self.policies_listed.add(kind)
            self._policies_changed()
        elif kind in WHILE_POLICIES and not self.open:
            self.listed[kind] = objects
            if set(self.listed) >= set(WHILE_POLICIES):
                self._open(self.listed)
            return
        self._pass_or_hold("replace", kind, objects)

    def changed(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        if kind in POLICY_KINDS:
            keys = self.policies[kind]
            if event == "DELETED":
                keys.discard(self._key(obj))
            else:
                keys.add(self._key(obj))
            self._policies_changed()
        self._pass_or_hold(event, kind, obj)

    def _policies_changed(self) -> None:
        """Before the change is passed on: a first policy holds what comes until Namespaces
        and Pods are listed; none (both kinds of policy listed, no watch running) opens the
        gate with none of either."""
        self._changed.set()
        if self._any():
            self._none_since = None
            if not self.wanted.is_set():
                self.wanted.set()
                self.open = False
                self.listed = {}
        elif (
            self.policies_listed >= set(POLICY_KINDS) and not self.wanted.is_set() and not self.open
        ):
            self._open({kind: [] for kind in WHILE_POLICIES})

    def _pass_or_hold(self, what: str, kind: str, arg: Any) -> None:
        if self.open:
            self._send(what, kind, arg)
        elif kind not in WHILE_POLICIES or kind in self.listed:
            self.held.append((what, kind, arg))
        # else: a Namespace or Pod before its own list (none comes: a watch follows its list)

    def _send(self, what: str, kind: str, arg: Any) -> None:
        if what == "replace":
            self.feed.replace(kind, arg)
        else:
            self.feed.changed(kind, what, arg)

    def _open(self, lists: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
        """Namespaces' and Pods' lists to the feed, then what was held, in order."""
        for kind in WHILE_POLICIES:
            self.feed.replace(kind, lists[kind])
        self.listed = {}
        self.open = True
        held, self.held = self.held, []
        for what, kind, arg in held:
            self._send(what, kind, arg)

    async def unwanted_for(self, idle: float, clock: Callable[[], float]) -> None:
        """Returns once no policy has existed for `idle` seconds."""
        while True:
            now = clock()
            if self._any():
                self._none_since = None
            elif self._none_since is None:
                self._none_since = now
            elif now - self._none_since >= idle:
                return
            self._changed.clear()
            wait = idle if self._none_since is None else idle - (now - self._none_since)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), max(wait, 0.0) + 0.01)

    def closed(self) -> None:
        """The watches stopped: the feed told there are no namespaces and pods. Unless a
        policy came as they stopped: then they are followed again at once (their lists
        replace what the feed knows)."""
        if self._any():
            return
        self.wanted.clear()
        self.open = False
        self._open({kind: [] for kind in WHILE_POLICIES})


async def follow(
    api: Api, kind: str, feed: Feed, clock: Callable[[], float] = time.monotonic
) -> None:
    """List `kind` and watch it, for ever: a watch that ends (the apiserver ends them) or fails
    is followed by a list again, after the one backoff (a CRD not installed lists as empty and
    its watch fails: tried again at the backoff's pace, up to five minutes)."""
    resource, namespaced = RESOURCES[kind]
    scope = "*" if namespaced else None
    backoff = Backoff(initial=1.0, maximum=300.0)
    while True:
        started = clock()
        try:
            found = await api.list(
                resource, namespace=scope, within=LIST_TIMEOUT, missing_is_empty=True
            )
            feed.replace(kind, [as_dict(o) for o in found])
            async for event, obj in api.watch(resource, namespace=scope):
                if event in ("ADDED", "MODIFIED", "DELETED"):
                    feed.changed(kind, event, as_dict(obj))
            log.debug("%s watch ended; listing again", kind)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("%s list or watch for network policy failed: %s", kind, exc)
        await asyncio.sleep(backoff.after_run(clock() - started))
