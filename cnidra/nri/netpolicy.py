"""Network policy applied to this node's pods: the agent-side reconciler between what the
cluster holds (fed by the watches, cnidra.kube.netpolicy) and each pod's nftables tables
(cnidra.datapath.netpolicy). docs/network-policy.md.

- **At attach** (`at_add`, the NRI hook right after an interface's ADD, before the pod's
  containers start): the interface's table is compiled from what is in memory and applied; the
  hook never waits for the apiserver. A failure to apply fails the attachment (it is rolled
  back): no interface on a network runs unpoliced because nft failed.
- **Not yet synced** (the driver just started and has not listed policies, namespaces and
  pods): an interface attached then gets a default deny both ways (what is always allowed
  still passes: neighbour discovery, DHCP), whether or not its network has policies, since that
  is not known yet; once synced, every local table is written again from the policies.
- **On changes** (policy, pod, address, namespace labels): the tables that changed are queued
  and applied by one task, in a thread, within about a second (`run`).
- **After a restart** (`restore`): the sandbox records say which interfaces are attached; their
  tables are read back from the kernel and rewritten in place once synced.
- **Gone**: a pod's tables go with its network namespace; an unplugged interface's table is
  deleted when no interface of its network is left in the pod.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cnidra.api import netpolicy as model
from cnidra.api.netpolicy_node import (
    Change,
    NodePolicy,
    PodFacts,
    pod_facts,
    table_name,
)
from cnidra.api.netpolicy_rules import (
    NetworkView,
    PodInterface,
    PodOnNetwork,
    Ruleset,
    UnenforceableInterface,
    compile_pod,
    enforcement,
    undoes_pod_side,
)
from cnidra.api.netpolicy_state import PodKey
from cnidra.cni.attach import Attachment, SetupFailed
from cnidra.cni.invoke import Deadline
from cnidra.cni.result import Result
from cnidra.datapath import netpolicy as nft
from cnidra.observe import metrics
from cnidra.state.sandboxes import SandboxRecord, SandboxStore, State

log = logging.getLogger(__name__)

REASON_POLICY = "policy"  # the ATTACH_FAILURES reason of a table that could not be applied
REASON_NOT_ENFORCED = "NetworkPolicyNotEnforced"
NFT_TIMEOUT = nft.DEFAULT_TIMEOUT_SECONDS
KINDS = ("MultiNetworkPolicy", "CNIAdminNetworkPolicy", "Namespace", "Pod")
NOT_SYNCED = "cnidra-not-synced"


class Nft(Protocol):
    """cnidra.datapath.netpolicy (tests pass a fake)."""

    def apply(
        self, netns: str, ruleset: Ruleset, previous: Ruleset | None = None, *, timeout: float
    ) -> str: ...

    def remove(self, netns: str, table: str = ..., *, timeout: float) -> None: ...


class Events(Protocol):
    def event(self, pod: Any, reason: str, message: str, type_: str = "Warning") -> None: ...


def target_of(key: str) -> model.Target:
    """The Target whose key is `key` (the spelling `Attachment.policy_network` holds)."""
    kind, sep, rest = key.partition(":")
    if sep and kind == "claim":
        namespace, _, name = rest.partition("/")
        return model.Target(model.TargetKind.CLAIM, name, namespace)
    if sep and kind in ("cninetwork", "deviceclass"):
        return model.Target(model.TargetKind(kind), rest)
    namespace, _, name = key.partition("/")
    return model.Target(model.TargetKind.NAD, name, namespace)


def deny_all(pod: PodOnNetwork, network: str, ifname: str) -> Ruleset:
    """Until synced: every direction isolated, nothing allowed but what always is."""
    policy = model.MultiNetworkPolicy(
        pod.namespace,
        NOT_SYNCED,
        (target_of(network),),
        model.EVERYTHING,
        (),
        (),
        frozenset(model.POLICY_TYPES),
    )
    view = NetworkView(network, (pod,), {})
    return compile_pod(pod, [PodInterface(ifname, view)], [policy], (), table_name(network))


@dataclass
class Local:
    """A local pod's sandbox: its namespace path, and what was flagged of it."""

    netns: str
    sandbox_id: str
    pod: Any  # its ObjectRef, for Events
    # interface -> (its network, why policy is not enforced on it)
    unenforced: dict[str, tuple[str, str]] = field(default_factory=dict)
    undoable: tuple[str, ...] = ()  # containers that could delete the tables


def plugin_type(att: Attachment) -> str:
    plugins = att.network.get("plugins") or []
    first = plugins[0] if plugins and isinstance(plugins[0], Mapping) else {}
    return str(first.get("type", ""))


def addresses_of(result: Mapping[str, Any] | None) -> tuple[str, ...]:
    if not result:
        return ()
    return tuple(
        str(ip["address"])
        for ip in Result(result).raw.get("ips") or []
        if isinstance(ip, Mapping) and ip.get("address")
    )


class PolicyEnforcer:
    def __init__(
        self,
        store: SandboxStore,
        *,
        events: Events | None = None,
        datapath: Nft = nft,
        enabled: bool = True,
        settle: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.events = events
        self.datapath = datapath
        self.enabled = enabled
        self.settle = settle
        self.clock = clock
        self.node = NodePolicy()
        self.synced_kinds: set[str] = set()
        self.local: dict[PodKey, Local] = {}
        self.applied: dict[tuple[str, str], Ruleset] = {}  # (netns, table) -> last applied
        self.dirty: set[Change] = set()
        self.failures = 0
        self._wake = asyncio.Event()

    # ------------------------------------------------------------------ state

    @property
    def synced(self) -> bool:
        return self.synced_kinds >= set(KINDS)

    def _mark(self, changes: Iterable[Change]) -> None:
        changes = set(changes)
        if changes:
            self.dirty |= changes
            self._wake.set()

    # ------------------------------------------------------------------ the watches' feed

    def replace(self, kind: str, objects: Sequence[Mapping[str, Any]]) -> None:
        """A list of every object of `kind` (at start, and whenever a watch restarts)."""
        if kind == "MultiNetworkPolicy":
            decoded = [p for p in map(decode_tenant, objects) if p is not None]
            self._mark(self.node.replace_policies(decoded, admin=False))
        elif kind == "CNIAdminNetworkPolicy":
            admins = [p for p in map(decode_admin, objects) if p is not None]
            self._mark(self.node.replace_policies(admins, admin=True))
        elif kind == "Namespace":
            labels = {name_of(o): labels_of(o) for o in objects}
            self._mark(self.node.replace_namespaces(labels))
        elif kind == "Pod":
            facts = [f for f in map(pod_facts, objects) if f is not None]
            self._mark(self.node.replace_pods(facts))
            for obj in objects:
                self._flag_undoable(obj)
        first = kind not in self.synced_kinds
        self.synced_kinds.add(kind)
        if first and self.synced:  # every table written again from the policies
            self._mark(
                (key, network) for key, networks in self.node.local.items() for network in networks
            )

    def changed(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        """One watch event (ADDED, MODIFIED, DELETED)."""
        deleted = event == "DELETED"
        if kind == "MultiNetworkPolicy":
            ref = f"{namespace_of(obj)}/{name_of(obj)}"
            tenant = None if deleted else decode_tenant(obj)
            if tenant is None:
                self._mark(self.node.remove_policy(ref))
            else:
                self._mark(self.node.set_policy(tenant))
        elif kind == "CNIAdminNetworkPolicy":
            admin = None if deleted else decode_admin(obj)
            if admin is None:
                self._mark(self.node.remove_policy(f"admin/{name_of(obj)}"))
            else:
                self._mark(self.node.set_policy(admin))
        elif kind == "Namespace":
            self._mark(self.node.set_namespace(name_of(obj), {} if deleted else labels_of(obj)))
        elif kind == "Pod":
            facts = None if deleted else pod_facts(obj)
            key = (namespace_of(obj), name_of(obj))
            if facts is None:
                self._mark(self.node.remove_pod(key))
            else:
                self._mark(self.node.set_pod(facts))
                self._flag_undoable(obj)

    def _flag_undoable(self, obj: Mapping[str, Any]) -> None:
        """A local pod whose containers could delete its tables (privileged, NET_ADMIN): an
        Event, once; `describe` shows it."""
        local = self.local.get((namespace_of(obj), name_of(obj)))
        if local is None:
            return
        who = tuple(undoes_pod_side(obj.get("spec") or {}))
        if who == local.undoable:
            return
        local.undoable = who
        if who and self.events is not None and self.node.local.get(local_key(obj)):
            self.events.event(
                local.pod,
                REASON_NOT_ENFORCED,
                f"containers {', '.join(who)} are privileged or have CAP_NET_ADMIN: they can "
                "delete the network policy tables cnidra keeps in the pod's network namespace",
            )

    # ------------------------------------------------------------------ the hook path

    async def at_add(
        self,
        record: SandboxRecord,
        labels: Mapping[str, str] | None,
        att: Attachment,
        deadline: Deadline | None,
    ) -> None:
        """Right after `att`'s ADD in the NRI hook: its network's table applied in the pod's
        namespace from what is in memory (a default deny when not synced yet). SetupFailed
        when it cannot be applied (the attachment is rolled back)."""
        network = att.policy_network
        if not self.enabled or not network:
            return
        key = (record.pod.namespace, record.pod.name)
        local = self.local.setdefault(key, Local(record.netns, record.sandbox_id, record.pod))
        local.netns, local.sandbox_id = record.netns, record.sandbox_id
        how = enforcement(plugin_type(att))
        if how.where is None:
            local.unenforced[att.if_name] = (network, how.refused)
            if self.node.policed(network) and self.events is not None:
                self.events.event(
                    record.pod,
                    REASON_NOT_ENFORCED,
                    f"{att.if_name} on {network}: policies apply to the network but cannot be "
                    f"enforced on this interface: {how.refused}",
                )
            return
        known = self.node.pods.get(key)
        facts = PodFacts(
            key[0],
            key[1],
            dict(labels) if labels is not None else dict(known.labels if known else {}),
            known.ports if known else (),
            {network: ()},
        )
        try:
            if self.synced:
                changes = self.node.set_local(facts, network, att.if_name)
                ruleset = self.node.ruleset(key, network)
                self._mark(changes - {(key, network)})
            else:
                self.node.set_local(facts, network, att.if_name)
                ruleset = deny_all(facts.on(network), network, att.if_name)
        except UnenforceableInterface as exc:
            self.node.remove_local(key, network)  # never compiled again: it is refused
            raise SetupFailed(f"network policy on {att.if_name}: {exc}", REASON_POLICY) from exc
        if ruleset is None:
            return
        timeout = NFT_TIMEOUT if deadline is None else min(NFT_TIMEOUT, deadline.remaining())
        if timeout <= 0:
            raise SetupFailed(
                f"network policy on {att.if_name} could not be applied: the ADD budget ran out",
                REASON_POLICY,
            )
        try:
            await asyncio.to_thread(
                self.datapath.apply, record.netns, ruleset, None, timeout=timeout
            )
        except nft.NftError as exc:
            raise SetupFailed(
                f"network policy on {att.if_name} could not be applied: {exc}", REASON_POLICY
            ) from exc
        self.applied[(record.netns, ruleset.table)] = ruleset

    def attached(self, record: SandboxRecord) -> None:
        """The sandbox's ADDs are done: its addresses are known to the other pods' tables (the
        watch brings them too, later, from the network-status annotation)."""
        if not self.enabled:
            return
        key = (record.pod.namespace, record.pod.name)
        known = self.node.pods.get(key)
        networks: dict[str, tuple[str, ...]] = {}
        for attached in record.attachments:
            network = attached.attachment.policy_network
            if network and not attached.pending:
                networks[network] = (*networks.get(network, ()), *addresses_of(attached.result))
        if not networks or known is None:
            return
        facts = PodFacts(
            known.namespace,
            known.name,
            known.labels,
            known.ports,
            {**known.networks, **networks},
        )
        self._mark(self.node.set_pod(facts))

    async def detached(self, record: SandboxRecord, attachments: Sequence[Attachment]) -> None:
        """Interfaces DELed from a live sandbox (an unplug): a network none of the pod's
        interfaces is on any more loses its table."""
        key = (record.pod.namespace, record.pod.name)
        left = {
            a.attachment.policy_network
            for a in record.attachments
            if a.attachment not in attachments and not a.pending
        }
        for att in attachments:
            network = att.policy_network
            if not network or network in left:
                continue
            self.node.remove_local(key, network)
            table = table_name(network)
            self.applied.pop((record.netns, table), None)
            if self.enabled:
                try:
                    await asyncio.to_thread(
                        self.datapath.remove, record.netns, table, timeout=NFT_TIMEOUT
                    )
                except nft.NftError as exc:
                    log.warning("pod %s: removing the policy table of %s: %s", key, network, exc)

    def forget(self, record: SandboxRecord) -> None:
        """The sandbox is gone, and its tables with its namespace."""
        key = (record.pod.namespace, record.pod.name)
        local = self.local.get(key)
        if local is None or local.sandbox_id != record.sandbox_id:
            return
        self.local.pop(key, None)
        self.node.remove_local(key)
        for applied in [k for k in self.applied if k[0] == record.netns]:
            del self.applied[applied]

    def restore(self) -> None:
        """After a restart: the interfaces the sandbox records say are attached are this
        node's; their tables are rewritten once synced (read back from the kernel first)."""
        if not self.enabled:
            return
        for record in self.store.all():
            if record.state is not State.ADDED:
                continue
            key = (record.pod.namespace, record.pod.name)
            self.local[key] = Local(record.netns, record.sandbox_id, record.pod)
            for attached in record.attachments:
                att = attached.attachment
                if attached.pending or not att.policy_network:
                    continue
                if enforcement(plugin_type(att)).where is None:
                    continue
                facts = PodFacts(
                    key[0],
                    key[1],
                    {},
                    (),
                    {att.policy_network: addresses_of(attached.result)},
                )
                try:
                    self.node.set_local(facts, att.policy_network, att.if_name)
                except UnenforceableInterface as exc:
                    self.node.remove_local(key, att.policy_network)
                    log.warning("pod %s: %s", key, exc)

    # ------------------------------------------------------------------ applying changes

    async def run(self) -> None:
        """Apply the tables that changed, each in a thread, as they change (a supervised
        task). Nothing is applied before the first sync but what `at_add` writes."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self.settle:
                await asyncio.sleep(self.settle)  # a burst of events: one apply per table
            if not self.synced:
                continue
            await self.apply_dirty()

    async def apply_dirty(self) -> None:
        dirty, self.dirty = self.dirty, set()
        retry: set[Change] = set()
        for key, network in sorted(dirty):
            local = self.local.get(key)
            ruleset = self.node.ruleset(key, network)
            if local is None or ruleset is None:
                continue
            where = (local.netns, ruleset.table)
            started = time.perf_counter()
            try:
                await asyncio.to_thread(
                    self.datapath.apply,
                    local.netns,
                    ruleset,
                    self.applied.get(where),
                    timeout=NFT_TIMEOUT,
                )
            except nft.NamespaceGone:
                continue
            except nft.NftError as exc:
                self.failures += 1
                self.applied.pop(where, None)  # read back next time
                log.warning("pod %s/%s: network policy on %s: %s", *key, network, exc)
                retry.add((key, network))
                continue
            self.applied[where] = ruleset
            metrics.POLICY_APPLY.observe(time.perf_counter() - started)
        if retry:
            loop = asyncio.get_running_loop()
            loop.call_later(1.0, self._mark, retry)

    # ------------------------------------------------------------------ for describe, metrics

    def describe(self, key: PodKey) -> dict[str, Any]:
        """The pod's networks: the policies applying to each, and what was flagged."""
        local = self.local.get(key)
        out: dict[str, Any] = {}
        for network, ifname in sorted(self.node.local.get(key, {}).items()):
            out[ifname] = {
                "network": network,
                "table": table_name(network),
                "policies": self.node.applying(key, network),
            }
        if local is not None:
            for ifname, (network, why) in local.unenforced.items():
                out[ifname] = {
                    "network": network,
                    "policies": self.node.policed(network),
                    "notEnforced": why,
                }
            if local.undoable:
                out["undoableBy"] = list(local.undoable)
        return out

    def tables(self) -> list[tuple[PodKey, str, str, str]]:
        """(pod, network, netns, table) of every table applied here (metrics read them; safe
        to call from another thread: it copies what it reads)."""
        out = []
        for (netns, table), _ in list(self.applied.items()):
            for key, local in list(self.local.items()):
                if local.netns != netns:
                    continue
                for network in list(self.node.local.get(key, {})):
                    if table_name(network) == table:
                        out.append((key, network, netns, table))
        return out


# ---------------------------------------------------------------------- object readers


def name_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def namespace_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("namespace", ""))


def local_key(obj: Mapping[str, Any]) -> PodKey:
    return (namespace_of(obj), name_of(obj))


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()}


def decode_tenant(obj: Mapping[str, Any]) -> model.MultiNetworkPolicy | None:
    policy, issues = model.decode_policy(obj, default_namespace=namespace_of(obj) or "default")
    if policy is not None:  # the tenancy rule: never another namespace's claim network
        issues = model.tenancy_problems(policy, None)
        if issues.errors:
            policy = None
    if policy is None:
        log.warning(
            "MultiNetworkPolicy %s/%s is not applied: %s",
            namespace_of(obj),
            name_of(obj),
            "; ".join(str(e) for e in issues.errors),
        )
    return policy


def decode_admin(obj: Mapping[str, Any]) -> model.AdminNetworkPolicy | None:
    policy, issues = model.decode_admin_policy(obj)
    if policy is None:
        log.warning(
            "CNIAdminNetworkPolicy %s is not applied: %s",
            name_of(obj),
            "; ".join(str(e) for e in issues.errors),
        )
    return policy


def policy_of(comment: str) -> str:
    """The policy a counted rule's comment names: `ns/name`, `admin/name`, `default-deny`."""
    return comment.split(" ", 1)[0] if comment else "-"


def read_drops(
    enforcer: PolicyEnforcer, datapath: Any = nft, timeout: float = 2.0
) -> list[tuple[str, str, int]]:
    """(network, policy, packets dropped) of every table applied here: the counters read from
    the kernel on the scrape (the caller is off the event loop; a table that cannot be read
    is left out)."""
    out = []
    for _key, network, netns, table in enforcer.tables():
        try:
            counted = datapath.counters(netns, table, timeout=timeout)
        except nft.NftError:
            continue
        for counter in counted:
            if counter.verdict == "drop":
                out.append((network, policy_of(counter.comment), counter.packets))
    return out
