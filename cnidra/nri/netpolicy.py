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
- **The tenancy rule**: a tenant's policy that names a network its namespace may not use is not
  applied, judged by the one rule `cnidra validate` uses (cnidra.api.netpolicy.tenancy_problems
  with a CatalogAccess), against the CNINetworks and DeviceClasses followed here, the
  namespaces' labels, and the NADs each namespace's pods are on (`NadsInUse`); judged again when
  any of those changes. It, and a policy that does not decode, gets a Warning Event and this
  node's status entry saying why (`report_problems`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cnidra.api import netpolicy as model
from cnidra.api.constants import CONDITION_POLICY, DRIVER_NAME
from cnidra.api.issues import ROOT
from cnidra.api.netpolicy_input import class_policies
from cnidra.api.netpolicy_node import (
    BRIDGE_MARK_PREFIX,
    HOST_TABLE_PREFIX,
    SPOOF_TABLE_PREFIX,
    Change,
    NodePolicy,
    PodFacts,
    bridge_mark,
    host_table_name,
    marked_bridge,
    pod_facts,
    spoof_table_name,
    table_name,
)
from cnidra.api.netpolicy_rules import (
    HOST_BRIDGE,
    POD_SIDE_CAVEAT,
    BridgePort,
    Enforcement,
    NetworkView,
    PodInterface,
    PodOnNetwork,
    Ruleset,
    UnenforceableInterface,
    anti_spoof_script,
    bridge_host_side,
    bridge_port,
    compile_pod,
    enforcement,
    host_interface,
    host_side,
    undoes_pod_side,
)
from cnidra.api.netpolicy_state import PodKey
from cnidra.api.networks import NamedNetwork, cninetwork
from cnidra.api.refs import ObjectRef
from cnidra.cni.attach import Attachment, SetupFailed
from cnidra.cni.invoke import Deadline
from cnidra.cni.result import Result
from cnidra.datapath import netpolicy as nft
from cnidra.observe import metrics
from cnidra.state.sandboxes import SandboxRecord, SandboxStore, State
from cnidra.status.devices import Condition, DeviceKey, policy_condition
from cnidra.status.netpolicy import NOT_APPLIED, PolicyRef, entry_of
from cnidra.util.backoff import Backoff

log = logging.getLogger(__name__)

REASON_POLICY = "policy"  # the ATTACH_FAILURES reason of a table that could not be applied
REASON_NOT_ENFORCED = "NetworkPolicyNotEnforced"
NFT_TIMEOUT = nft.DEFAULT_TIMEOUT_SECONDS
APPLY_RETRY = 1.0  # seconds before a failed table is applied again, at first
APPLY_RETRY_MAX = 30.0  # ... and at most
APPLY_CONCURRENCY = 4  # tables applied at once by the task (an nft process each)
# what is listed before the driver is synced: the last two for the tenancy rule alone
KINDS = (
    "MultiNetworkPolicy",
    "CNIAdminNetworkPolicy",
    "Namespace",
    "Pod",
    "CNINetwork",
    "DeviceClass",
)
NOT_SYNCED = "cnidra-not-synced"


class Nft(Protocol):
    """cnidra.datapath.netpolicy (tests pass a fake)."""

    def apply(
        self, netns: str, ruleset: Ruleset, previous: Ruleset | None = None, *, timeout: float
    ) -> str: ...

    def remove(self, netns: str, table: str = ..., *, timeout: float) -> None: ...

    def list_tables(self, netns: str, *, timeout: float) -> list[str]: ...


class BridgeHost(Protocol):
    """The host-side steps of a bridge interface's policy (cnidra.datapath.netpolicy; tests
    pass a fake): its bridge's nf_call switches and its port's anti-spoofing table."""

    def bridge_nf_call(self, netns: str, bridge: str, *, timeout: float) -> bool: ...

    def set_bridge_nf_call(
        self, netns: str, bridge: str, on: bool, *, mark: str = ..., timeout: float
    ) -> None: ...

    def apply_script(self, netns: str, script: str, *, timeout: float) -> None: ...


class Events(Protocol):
    def event(self, pod: Any, reason: str, message: str, type_: str = "Warning") -> None: ...


class Conditions(Protocol):
    """Where the claims' NetworkPolicyEnforced conditions go (StatusWriter.device_condition:
    queued, written off the hook path)."""

    def device_condition(
        self, claim: ObjectRef, key: DeviceKey, type_: str, condition: Condition | None
    ) -> None: ...


class Reports(Protocol):
    """Where a policy's problems on this node go (cnidra.status.netpolicy.PolicyStatusWriter:
    an Event and the policy's status, written off the hook path)."""

    def report(self, ref: PolicyRef, problems: Sequence[str], *, event: bool = True) -> None: ...


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
    # interface -> (its claim, its status.devices entry, its network): for the condition
    devices: dict[str, tuple[ObjectRef, DeviceKey, str]] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)  # as the runtime or the watch gave
    # network -> the host's end of the pod's veth, where its table is (ptp); else the pod's
    host: dict[str, str] = field(default_factory=dict)
    # network -> the pod's port on a bridge, when enforced on the host (its `host` entry is the
    # port): the host table keys on its addresses, the port has an anti-spoofing table
    bridged: dict[str, BridgePort] = field(default_factory=dict)


def device_key(att: Attachment) -> DeviceKey:
    """The claim's status.devices entry of `att` (cnidra.nri.lifecycle.status_key)."""
    return (DRIVER_NAME, att.pool, att.device, att.share_id or "")


# plugin types whose device may be bound to a userspace driver (DPDK): then the plugin reports
# no interface in the pod's namespace, and there is no kernel path to filter
MAYBE_USERSPACE = frozenset({"sriov", "host-device"})


def kernel_netdev(plugin: str, result: Result | None) -> bool:
    """Whether the interface an ADD gave is a kernel netdev: for a plugin that can hand over a
    device bound to vfio-pci (sriov-cni in DPDK mode returns an empty result; host-device with a
    `pciBusID` of a vfio device moves no link), one its result lists in the sandbox."""
    if plugin not in MAYBE_USERSPACE or result is None:
        return True
    return bool(result.sandbox_interfaces())


def main_plugin(att: Attachment) -> Mapping[str, Any]:
    """The first plugin of the attachment's conflist (the one that makes the interface)."""
    plugins = att.network.get("plugins") or []
    return plugins[0] if plugins and isinstance(plugins[0], Mapping) else {}


def plugin_type(att: Attachment) -> str:
    return str(main_plugin(att).get("type", ""))


def placement(
    att: Attachment, result: Mapping[str, Any] | None, *, bridge_on_host: bool
) -> tuple[Enforcement, str | None, BridgePort | None]:
    """Where an attachment's policy goes: (how, the host interface its table is on, the pod's
    bridge port). A bridge interface whose CNI result does not say enough to key the host's
    rules on the pod (`bridge_port`) is enforced in the pod's namespace."""
    plugin = plugin_type(att)
    how = enforcement(
        plugin,
        kernel_netdev=kernel_netdev(plugin, Result(result) if result is not None else None),
        bridge_on_host=bridge_on_host,
    )
    if how.where != "host":
        return how, None, None
    if plugin in HOST_BRIDGE:
        port = bridge_port(main_plugin(att), result)
        if port is None:
            return Enforcement("pod", caveat=POD_SIDE_CAVEAT), None, None
        return how, port.port, port
    return how, host_interface(plugin, result), None


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
        conditions: Conditions | None = None,
        reports: Reports | None = None,
        node_name: str = "",
        host_netns: str = "/proc/self/ns/net",
        datapath: Nft = nft,
        bridge_datapath: BridgeHost = nft,
        bridge_on_host: bool = False,
        enabled: bool = True,
        settle: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.events = events
        self.conditions = conditions
        self.reports = reports
        self.node_name = node_name
        self.host_netns = host_netns  # where host-side tables go (the driver's: the node's)
        self.doomed: set[tuple[str, str]] = set()  # host tables to remove: (netns, table)
        self.swept = False  # the host's tables left by an earlier run removed
        # every pod whose containers could delete a table in its namespace (few): by pod
        self.net_admin: dict[PodKey, tuple[str, ...]] = {}
        # the problems each policy was last reported with; the policies whose status holds an
        # entry of this node from before (cleared once synced, unless still true)
        self.reported: dict[PolicyRef, tuple[str, ...]] = {}
        self.stale: set[PolicyRef] = set()
        self.datapath = datapath
        # bridge interfaces on the host (the driver's default; off here, so that a caller that
        # did not ask never touches the bridges of the namespace it runs in)
        self.bridge_datapath = bridge_datapath
        self.bridge_on_host = bridge_on_host
        self.bridge_ports: dict[str, set[Change]] = {}  # bridge -> the policed ports on it
        self.marked: set[str] = set()  # bridges whose nf_call cnidra turned on
        self.unflag: set[str] = set()  # bridges whose last policed port went
        self.bridge_lock = asyncio.Lock()  # turning a bridge's switch on and off, one at a time
        self.enabled = enabled
        self.settle = settle
        self.clock = clock
        self.node = NodePolicy()
        # the tenancy rule: every tenant policy that decodes, applied or not, by ref; those
        # naming a network not of their own namespace (judged again when what it reads
        # changes); why each policy is not applied; what the rule reads of the cluster
        self.tenants: dict[str, model.MultiNetworkPolicy] = {}
        self.foreign: set[str] = set()
        self.refused: dict[PolicyRef, str] = {}
        self.cninetworks: dict[str, NamedNetwork | Unusable] = {}
        self.device_classes: dict[str, Any] = {}  # name -> its CNIPolicy or None
        self.synced_kinds: set[str] = set()
        self.local: dict[PodKey, Local] = {}
        self.applied: dict[tuple[str, str], Ruleset] = {}  # (netns, table) -> last applied
        # (netns, table) of new interfaces no policy governs: no table made, as it would only
        # accept everything (an nft run at each ADD and DEL of every pod on a network without
        # a policy); made when a policy comes to govern it (`apply_dirty`)
        self.unneeded: set[tuple[str, str]] = set()
        self.dirty: set[Change] = set()
        self.failures = 0
        # each failing table's retry pace (the one backoff), forgotten once it applies
        self.apply_backoffs: dict[Change, Backoff] = {}
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
        if kind in ("MultiNetworkPolicy", "CNIAdminNetworkPolicy"):
            self.stale |= {ref_of(kind, o) for o in objects if entry_of(o, self.node_name)}
        if kind == "MultiNetworkPolicy":
            self.tenants.clear()
            self.foreign.clear()
            self.refused = {r: w for r, w in self.refused.items() if r.kind != kind}
            for obj in objects:
                tenant, why = decode_tenant(obj)
                if tenant is None:
                    self.refused[ref_of(kind, obj)] = why
                else:
                    self._hold(tenant)
            accepted = [p for p in self.tenants.values() if self._refusal(p) is None]
            self._mark(self.node.replace_policies(accepted, admin=False))
        elif kind == "CNIAdminNetworkPolicy":
            self.refused = {r: w for r, w in self.refused.items() if r.kind != kind}
            admins = []
            for obj in objects:
                admin, why = decode_admin(obj)
                if admin is None:
                    self.refused[ref_of(kind, obj)] = why
                else:
                    admins.append(admin)
            self._mark(self.node.replace_policies(admins, admin=True))
        elif kind == "Namespace":
            labels = {name_of(o): labels_of(o) for o in objects}
            self._mark(self.node.replace_namespaces(labels))
            self._rejudge()
        elif kind == "Pod":
            facts = [f for f in map(pod_facts, objects) if f is not None]
            self._mark(self.node.replace_pods(facts))
            self.net_admin.clear()
            for obj in objects:
                self._flag_undoable(obj)
            self._rejudge(nads_only=True)
        elif kind == "CNINetwork":
            self.cninetworks = {name_of(o): cninetwork_rules(o) for o in objects}
            self._rejudge()
        elif kind == "DeviceClass":
            self.device_classes = class_policies([{**o, "kind": kind} for o in objects])
            self._rejudge()
        self._wake.set()  # the problems reported on policies are looked at again
        first = kind not in self.synced_kinds
        self.synced_kinds.add(kind)
        if first and self.synced:  # every table written again from the policies
            # what the rule read before every kind was listed was partial: judged again,
            # and a refusal that stands logged now
            for tenant in self.tenants.values():
                self.refused.pop(PolicyRef(model.MNP_KIND, tenant.name, tenant.namespace), None)
            self._rejudge()
            self._mark(
                (key, network) for key, networks in self.node.local.items() for network in networks
            )

    def changed(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        """One watch event (ADDED, MODIFIED, DELETED)."""
        deleted = event == "DELETED"
        self._wake.set()  # the problems reported on policies are looked at again
        if kind in ("MultiNetworkPolicy", "CNIAdminNetworkPolicy") and entry_of(
            obj, self.node_name
        ):
            self.stale.add(ref_of(kind, obj))
        if kind in ("MultiNetworkPolicy", "CNIAdminNetworkPolicy"):
            self._policy_changed(kind, obj, deleted)
        elif kind == "Namespace":
            self._mark(self.node.set_namespace(name_of(obj), {} if deleted else labels_of(obj)))
            self._rejudge()
        elif kind == "Pod":
            facts = None if deleted else pod_facts(obj)
            key = (namespace_of(obj), name_of(obj))
            if facts is None:
                self._mark(self.node.remove_pod(key))
                self.net_admin.pop(key, None)
            else:
                self._mark(self.node.set_pod(facts))
                self._flag_undoable(obj)
            self._rejudge(nads_only=True, namespace=key[0])
        elif kind == "CNINetwork":
            if deleted:
                self.cninetworks.pop(name_of(obj), None)
            else:
                self.cninetworks[name_of(obj)] = cninetwork_rules(obj)
            self._rejudge()
        elif kind == "DeviceClass":
            self.device_classes.pop(name_of(obj), None)
            if not deleted:
                self.device_classes.update(class_policies([{**obj, "kind": kind}]))
            self._rejudge()

    def _policy_changed(self, kind: str, obj: Mapping[str, Any], deleted: bool) -> None:
        """A tenant's or an admin's policy came, changed or went."""
        self.refused.pop(ref_of(kind, obj), None)
        if kind == "MultiNetworkPolicy":
            ref = f"{namespace_of(obj)}/{name_of(obj)}"
            self.tenants.pop(ref, None)
            self.foreign.discard(ref)
            tenant, why = (None, "") if deleted else decode_tenant(obj)
            if tenant is None:
                if why:
                    self.refused[ref_of(kind, obj)] = why
                self._mark(self.node.remove_policy(ref))
            else:
                self._hold(tenant)
                self._mark(self._judged(tenant))
            return
        admin, why = (None, "") if deleted else decode_admin(obj)
        if admin is None:
            if why:
                self.refused[ref_of(kind, obj)] = why
            self._mark(self.node.remove_policy(f"admin/{name_of(obj)}"))
        else:
            self._mark(self.node.set_policy(admin))

    # DeviceClasses come from the driver's one watch of them (cnidra.kube.deviceclasses)

    def replace_classes(self, objects: Sequence[Mapping[str, Any]]) -> None:
        self.replace("DeviceClass", objects)

    def class_changed(self, event: str, obj: Mapping[str, Any]) -> None:
        self.changed("DeviceClass", event, obj)

    # ------------------------------------------------------------------ the tenancy rule

    def _hold(self, policy: model.MultiNetworkPolicy) -> None:
        self.tenants[policy.ref] = policy
        if any(
            t.namespace != policy.namespace
            or t.kind not in (model.TargetKind.NAD, model.TargetKind.CLAIM)
            for t in policy.targets
        ):
            self.foreign.add(policy.ref)

    def access(self) -> model.CatalogAccess:
        """The tenancy rule's view of the cluster, as this driver follows it."""
        return model.CatalogAccess(
            self.cninetworks,
            self.device_classes,
            self.node.namespace_labels,
            NadsInUse(self.node.pods),
        )

    def _refusal(self, policy: model.MultiNetworkPolicy) -> str | None:
        """Why the tenancy rule refuses `policy` (None: it is applied), kept in `refused`; a
        new answer is logged once synced (before, the rule reads a partial cluster)."""
        ref = PolicyRef(model.MNP_KIND, policy.name, policy.namespace)
        why = None
        if policy.ref in self.foreign:
            issues = model.tenancy_problems(policy, self.access())
            why = "; ".join(e.message for e in issues.errors) or None
        if why is None:
            self.refused.pop(ref, None)
        elif self.refused.get(ref) != why:
            self.refused[ref] = why
            if self.synced:
                log.warning("MultiNetworkPolicy %s is not applied: %s", policy.ref, why)
        return why

    def _judged(self, policy: model.MultiNetworkPolicy) -> set[Change]:
        """`policy` applied, or removed when the tenancy rule refuses it: the tables that
        changed."""
        if self._refusal(policy) is not None:
            return self.node.remove_policy(policy.ref)
        if self.node.tenant.get(policy.ref) == policy:
            return set()
        return self.node.set_policy(policy)

    def _rejudge(self, nads_only: bool = False, namespace: str | None = None) -> None:
        """The policies naming networks not of their namespace judged again (what the rule
        reads changed); `nads_only`: only those naming another namespace's NAD (the pods
        changed, which says which NADs a namespace is on), of `namespace` when given (the
        namespace of the pod that changed: a pod event costs nothing for the others)."""
        for ref in sorted(self.foreign):
            policy = self.tenants[ref]
            if namespace is not None and policy.namespace != namespace:
                continue
            if nads_only and not any(
                t.kind is model.TargetKind.NAD and t.namespace != policy.namespace
                for t in policy.targets
            ):
                continue
            self._mark(self._judged(policy))

    def _flag_undoable(self, obj: Mapping[str, Any]) -> None:
        """A pod whose containers could delete its tables (privileged, NET_ADMIN): kept (a pod
        the watch sees before its sandbox is attached here); a local one gets an Event, once,
        and its interfaces' condition says so; `describe` shows it."""
        key = local_key(obj)
        who = tuple(undoes_pod_side(obj.get("spec") or {}))
        if who:
            self.net_admin[key] = who
        else:
            self.net_admin.pop(key, None)
        local = self.local.get(key)
        if local is None:
            return
        local.labels = labels_of(obj)
        if who == local.undoable:
            return
        local.undoable = who
        self._set_conditions(key)
        self._event_undoable(key, local)

    def _event_undoable(self, key: PodKey, local: Local) -> None:
        """The Warning Event of a pod whose containers could delete its tables, when some of
        them are in its namespace."""
        pod_side = [n for n in self.node.local.get(key, {}) if n not in local.host]
        if local.undoable and self.events is not None and pod_side:
            self.events.event(
                local.pod,
                REASON_NOT_ENFORCED,
                f"containers {', '.join(local.undoable)} are privileged or have CAP_NET_ADMIN: "
                "they can delete the network policy tables cnidra keeps in the pod's network "
                "namespace",
            )

    # ------------------------------------------------------------------ the hook path

    async def at_add(
        self,
        record: SandboxRecord,
        labels: Mapping[str, str] | None,
        att: Attachment,
        deadline: Deadline | None,
        result: Result | None = None,
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
        if labels is not None:
            local.labels = dict(labels)
        local.devices[att.if_name] = (att.claim, device_key(att), network)
        raw = result.raw if result is not None else None
        how, host_if, port = placement(att, raw, bridge_on_host=self.bridge_on_host)
        if how.where is None:
            self._not_enforced(record, local, att.if_name, network, how.refused)
            return
        if how.where == "host" and host_if:
            local.host[network] = host_if
            if port is not None:
                local.bridged[network] = port
                self.bridge_ports.setdefault(port.bridge, set()).add((key, network))
        known = self.node.pods.get(key)
        facts = PodFacts(
            key[0],
            key[1],
            dict(labels) if labels is not None else dict(known.labels if known else {}),
            known.ports if known else (),
            {network: ()},
        )
        ruleset = self._compiled_at_add(key, facts, network, att.if_name)
        if ruleset is None:
            return
        timeout = NFT_TIMEOUT if deadline is None else min(NFT_TIMEOUT, deadline.remaining())
        if timeout <= 0:
            raise SetupFailed(
                f"network policy on {att.if_name} could not be applied: the ADD budget ran out",
                REASON_POLICY,
            )
        try:
            netns, ruleset = self._placed(local, network, ruleset)
            where = (netns, ruleset.table)
            if port is None and not ruleset.isolating and where not in self.applied:
                self.unneeded.add(where)  # nothing to enforce yet: no table
                return
            if port is not None:  # the port held to the pod's addresses, the bridge switched
                await self._bridge_up(network, port, timeout)
            await asyncio.to_thread(self.datapath.apply, netns, ruleset, None, timeout=timeout)
        except UnenforceableInterface as exc:  # the host veth's name
            self.node.remove_local(key, network)
            raise SetupFailed(f"network policy on {att.if_name}: {exc}", REASON_POLICY) from exc
        except nft.NftError as exc:
            raise SetupFailed(
                f"network policy on {att.if_name} could not be applied: {exc}", REASON_POLICY
            ) from exc
        self.applied[(netns, ruleset.table)] = ruleset

    def _compiled_at_add(
        self, key: PodKey, facts: PodFacts, network: str, if_name: str
    ) -> Ruleset | None:
        """The pod's table of `network` with its new interface on it: as the policies say once
        synced, a default deny before. SetupFailed when the interface cannot be enforced."""
        try:
            if self.synced:
                changes = self.node.set_local(facts, network, if_name)
                self._rejudge(nads_only=True, namespace=key[0])  # its namespace is on it now
                self._mark(changes - {(key, network)})
                return self.node.ruleset(key, network)
            self.node.set_local(facts, network, if_name)
            return deny_all(facts.on(network), network, if_name)
        except UnenforceableInterface as exc:
            self.node.remove_local(key, network)  # never compiled again: it is refused
            raise SetupFailed(f"network policy on {if_name}: {exc}", REASON_POLICY) from exc

    def _not_enforced(
        self, record: SandboxRecord, local: Local, if_name: str, network: str, why: str
    ) -> None:
        """An interface no table can police: recorded (the policies selecting it are told) and,
        where policies apply to its network, a Warning Event on the pod."""
        local.unenforced[if_name] = (network, why)
        self._wake.set()
        if self.node.policed(network) and self.events is not None:
            self.events.event(
                record.pod,
                REASON_NOT_ENFORCED,
                f"{if_name} on {network}: policies apply to the network but cannot be "
                f"enforced on this interface: {why}",
            )

    async def _bridge_up(self, network: str, port: BridgePort, budget: float) -> None:
        """Before a bridge interface's host table: the anti-spoofing table on its port, and its
        bridge's nf_call switches on (marked as cnidra's when they were off; left as found
        when they were on already). NftError when either fails: the attach fails closed."""
        script = anti_spoof_script(port, spoof_table_name(network, port.port))
        host = self.host_netns
        await asyncio.to_thread(self.bridge_datapath.apply_script, host, script, timeout=budget)
        async with self.bridge_lock:
            if port.bridge in self.marked:
                return
            on = await asyncio.to_thread(
                self.bridge_datapath.bridge_nf_call, host, port.bridge, timeout=budget
            )
            if not on:
                await asyncio.to_thread(
                    self.bridge_datapath.set_bridge_nf_call,
                    host,
                    port.bridge,
                    True,
                    mark=bridge_mark(port.bridge),
                    timeout=budget,
                )
                self.marked.add(port.bridge)
                log.info("bridge %s: nf_call_iptables/ip6tables on (network policy)", port.bridge)

    def _bridge_gone(self, key: PodKey, network: str, port: BridgePort) -> None:
        """A policed port is gone: its anti-spoofing table is removed by the task, and its
        bridge's switches turned off again when cnidra turned them on and no policed port is
        left on it."""
        self.doomed.add((self.host_netns, spoof_table_name(network, port.port)))
        ports = self.bridge_ports.get(port.bridge, set())
        ports.discard((key, network))
        if not ports:
            self.bridge_ports.pop(port.bridge, None)
            self.unflag.add(port.bridge)
        self._wake.set()

    def _placed(self, local: Local, network: str, ruleset: Ruleset) -> tuple[str, Ruleset]:
        """Where the table of `network` goes, and in what form: on the host's end of the pod's
        veth (ptp), or in the pod's namespace as compiled."""
        host_if = local.host.get(network)
        if host_if is None:
            return local.netns, ruleset
        table = host_table_name(network, host_if)
        port = local.bridged.get(network)
        if port is not None:
            return self.host_netns, bridge_host_side(ruleset, port, table)
        return self.host_netns, host_side(ruleset, host_if, table)

    def where(self, key: PodKey, network: str) -> tuple[str, str] | None:
        """(netns, table) of the pod's table of `network`; None: the pod is not local."""
        local = self.local.get(key)
        if local is None:
            return None
        host_if = local.host.get(network)
        if host_if is not None:
            return self.host_netns, host_table_name(network, host_if)
        return local.netns, table_name(network)

    def attached(self, record: SandboxRecord) -> None:
        """The sandbox's ADDs are done: its addresses are known to the other pods' tables (the
        watch brings them too, later, from the network-status annotation)."""
        if not self.enabled:
            return
        key = (record.pod.namespace, record.pod.name)
        local = self.local.get(key)
        seen = self.net_admin.get(key, ())  # the watch saw the pod before its sandbox
        if local is not None and seen and seen != local.undoable:
            local.undoable = seen
            self._event_undoable(key, local)
        self._set_conditions(key)
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
        local = self.local.get(key)
        for att in attachments:
            if local is not None:
                local.devices.pop(att.if_name, None)
                if local.unenforced.pop(att.if_name, None) is not None:
                    self._wake.set()
        for att in attachments:
            network = att.policy_network
            if not network or network in left:
                continue
            self.node.remove_local(key, network)
            netns, table = record.netns, table_name(network)
            host_if = local.host.pop(network, None) if local is not None else None
            port = local.bridged.pop(network, None) if local is not None else None
            if port is not None:
                self._bridge_gone(key, network, port)
            if host_if is not None:
                netns, table = self.host_netns, host_table_name(network, host_if)
            self.applied.pop((netns, table), None)
            if (netns, table) in self.unneeded:
                self.unneeded.discard((netns, table))  # never made
                continue
            if self.enabled:
                try:
                    await asyncio.to_thread(self.datapath.remove, netns, table, timeout=NFT_TIMEOUT)
                except nft.NftError as exc:
                    log.warning("pod %s: removing the policy table of %s: %s", key, network, exc)
                    if host_if is not None:
                        self.doomed.add((netns, table))  # tried again by the task

    def forget(self, record: SandboxRecord) -> None:
        """The sandbox is gone, and its tables with its namespace."""
        key = (record.pod.namespace, record.pod.name)
        local = self.local.get(key)
        if local is None or local.sandbox_id != record.sandbox_id:
            return
        gone = self.local.pop(key)
        if gone.unenforced:
            self._wake.set()
        for network, port in gone.bridged.items():
            self._bridge_gone(key, network, port)
        for network, host_if in gone.host.items():  # the host's tables outlive the pod
            where = (self.host_netns, host_table_name(network, host_if))
            self.applied.pop(where, None)
            if where in self.unneeded:
                self.unneeded.discard(where)  # never made
                continue
            self.doomed.add(where)
            self._wake.set()
        self.node.remove_local(key)
        for applied in [k for k in self.applied if k[0] == record.netns]:
            del self.applied[applied]
        self.unneeded = {k for k in self.unneeded if k[0] != record.netns}

    def restore(self) -> None:
        """After a restart: the interfaces the sandbox records say are attached are this
        node's; their tables are rewritten once synced (read back from the kernel first)."""
        if not self.enabled:
            return
        for record in self.store.all():
            if record.state is not State.ADDED:
                continue
            key = (record.pod.namespace, record.pod.name)
            local = self.local[key] = Local(record.netns, record.sandbox_id, record.pod)
            for attached in record.attachments:
                att = attached.attachment
                if attached.pending or not att.policy_network:
                    continue
                local.devices[att.if_name] = (att.claim, device_key(att), att.policy_network)
                how, host_if, port = placement(  # an empty result is no result, as before
                    att, attached.result or None, bridge_on_host=self.bridge_on_host
                )
                if how.where is None:
                    local.unenforced[att.if_name] = (att.policy_network, how.refused)
                    continue
                if how.where == "host" and host_if:
                    local.host[att.policy_network] = host_if
                    if port is not None:
                        local.bridged[att.policy_network] = port
                        ports = self.bridge_ports.setdefault(port.bridge, set())
                        ports.add((key, att.policy_network))
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
            self._set_conditions(key)

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
            await self.remove_doomed()
            self.report_problems()

    async def remove_doomed(self) -> None:
        """The host's tables of pods that went, and once after a start (`swept`) every host
        table of cnidra's that no local interface has: a table the last run left behind when
        its pod went while the driver was down. A failure is tried again at the next wake."""
        if not self.swept and self.enabled:
            wanted: set[tuple[str, str] | None] = {
                self.where(k, n) for k, nets in self.node.local.items() for n in nets
            }
            wanted |= {
                (self.host_netns, spoof_table_name(n, port.port))
                for local in self.local.values()
                for n, port in local.bridged.items()
            }
            try:
                found = await asyncio.to_thread(
                    self.datapath.list_tables, self.host_netns, timeout=NFT_TIMEOUT
                )
            except nft.NftError as exc:
                log.warning("the host's policy tables could not be listed: %s", exc)
            else:
                self.swept = True
                self.doomed |= {
                    (self.host_netns, t)
                    for t in found
                    if t.startswith((HOST_TABLE_PREFIX, SPOOF_TABLE_PREFIX))
                    and (self.host_netns, t) not in wanted
                }
                for t in found:  # bridges an earlier run switched on
                    bridge = marked_bridge(t) if t.startswith(BRIDGE_MARK_PREFIX) else None
                    if bridge is not None:
                        self.marked.add(bridge)
                        if not self.bridge_ports.get(bridge):
                            self.unflag.add(bridge)
        for where in sorted(self.doomed):
            try:
                await asyncio.to_thread(self.datapath.remove, *where, timeout=NFT_TIMEOUT)
            except nft.NftError as exc:
                log.warning("removing the host's policy table %s: %s", where[1], exc)
                continue
            self.doomed.discard(where)
        await self.release_bridges()

    async def release_bridges(self) -> None:
        """The bridges whose last policed port went: their nf_call switches turned off again
        (and their marks removed) when cnidra turned them on; a bridge that is gone takes its
        switches with it (its mark is removed). A failure is tried again at the next wake."""
        for bridge in sorted(self.unflag):
            async with self.bridge_lock:
                if self.bridge_ports.get(bridge):  # a pod came meanwhile: it stays on
                    self.unflag.discard(bridge)
                    continue
                if bridge in self.marked:
                    try:
                        await asyncio.to_thread(
                            self.bridge_datapath.set_bridge_nf_call,
                            self.host_netns,
                            bridge,
                            False,
                            mark=bridge_mark(bridge),
                            timeout=NFT_TIMEOUT,
                        )
                    except nft.NftError as exc:
                        log.warning("bridge %s: nf_call_iptables left on: %s", bridge, exc)
                        self.doomed.add((self.host_netns, bridge_mark(bridge)))
                    else:
                        log.info("bridge %s: nf_call_iptables/ip6tables off again", bridge)
                    self.marked.discard(bridge)
                self.unflag.discard(bridge)

    async def apply_dirty(self) -> None:
        """Every table that changed, applied from what was applied last, at most
        APPLY_CONCURRENCY at once (each an nft process in a thread; tables are independent, so
        a change that touches every local pod's table, a peer moving, does not wait for them
        one after the other). A failure is retried after its own backoff (1 s, doubling to
        30 s), forgotten once the table applies or its pod is gone."""
        dirty, self.dirty = self.dirty, set()
        retry: set[Change] = set()
        gate = asyncio.Semaphore(APPLY_CONCURRENCY)

        async def one(key: PodKey, network: str) -> None:
            local = self.local.get(key)
            ruleset = self.node.ruleset(key, network)
            if local is None or ruleset is None:
                self.apply_backoffs.pop((key, network), None)
                return
            try:
                netns, ruleset = self._placed(local, network, ruleset)
            except UnenforceableInterface as exc:
                log.warning("pod %s/%s: network policy on %s: %s", *key, network, exc)
                return
            where = (netns, ruleset.table)
            if where in self.unneeded and not ruleset.isolating:
                return  # still nothing to enforce
            async with gate:
                started = time.perf_counter()
                try:
                    await asyncio.to_thread(
                        self.datapath.apply,
                        netns,
                        ruleset,
                        self.applied.get(where),
                        timeout=NFT_TIMEOUT,
                    )
                except nft.NamespaceGone:
                    return
                except nft.NftError as exc:
                    self.failures += 1
                    self.applied.pop(where, None)  # read back next time
                    log.warning("pod %s/%s: network policy on %s: %s", *key, network, exc)
                    retry.add((key, network))
                    return
            self.applied[where] = ruleset
            self.unneeded.discard(where)
            self.apply_backoffs.pop((key, network), None)
            metrics.POLICY_APPLY.observe(time.perf_counter() - started)

        await asyncio.gather(*(one(key, network) for key, network in sorted(dirty)))
        loop = asyncio.get_running_loop()
        for change in retry:
            pace = self.apply_backoffs.setdefault(change, Backoff(APPLY_RETRY, APPLY_RETRY_MAX))
            loop.call_later(pace.next(), self._mark, (change,))

    # ------------------------------------------------------------------ conditions, reports

    def _set_conditions(self, key: PodKey) -> None:
        """The NetworkPolicyEnforced condition of each of the pod's interfaces on a network
        policy can name (queued: the status writer writes it off the hook path)."""
        local = self.local.get(key)
        if local is None or self.conditions is None or not self.enabled:
            return
        for ifname, (claim, dkey, network) in local.devices.items():
            refused = local.unenforced.get(ifname, ("", ""))[1]
            host_if = local.host.get(network, "")
            port = local.bridged.get(network)
            condition = policy_condition(
                ifname,
                network,
                refused,
                () if host_if else local.undoable,
                host_if=host_if,
                bridge=port.bridge if port is not None else "",
            )
            self.conditions.device_condition(claim, dkey, CONDITION_POLICY, condition)

    def problems(self) -> dict[PolicyRef, tuple[str, ...]]:
        """Each policy that selects an interface of this node where it cannot be enforced, with
        one line per such interface."""
        found: dict[PolicyRef, list[str]] = {}
        for key, local in self.local.items():
            for ifname, (network, why) in local.unenforced.items():
                for ref in self.node.applying(key, network, local.labels):
                    line = f"pod {key[0]}/{key[1]} {ifname} ({network}): {why}"
                    found.setdefault(self._policy_ref(ref), []).append(line)
        return {ref: tuple(sorted(lines)) for ref, lines in found.items()}

    def _policy_ref(self, ref: str) -> PolicyRef:
        if ref in self.node.tenant:
            policy = self.node.tenant[ref]
            return PolicyRef(model.MNP_KIND, policy.name, policy.namespace)
        return PolicyRef(model.ADMIN_KIND, self.node.admin[ref].name)

    def report_problems(self) -> None:
        """Tell `reports` what changed of the policies' problems on this node (once synced):
        an Event for a new one, and each policy's status entry of this node; an entry left by
        an earlier run that no longer holds is removed."""
        if self.reports is None or not self.synced:
            return
        now = self.problems()
        for ref, why in self.refused.items():
            now[ref] = (NOT_APPLIED + why, *now.get(ref, ()))
        for ref in sorted(set(self.reported) | set(now) | self.stale):
            problems = now.get(ref, ())
            if ref in self.reported and self.reported[ref] == problems and ref not in self.stale:
                continue
            if not problems and not self._known(ref):  # deleted: nothing to write on
                self.reported.pop(ref, None)
                self.stale.discard(ref)
                continue
            self.reports.report(ref, problems)
            self.stale.discard(ref)
            if problems:
                self.reported[ref] = problems
            else:
                self.reported.pop(ref, None)

    def _known(self, ref: PolicyRef) -> bool:
        if ref in self.refused:
            return True
        if ref.kind == model.MNP_KIND:
            return f"{ref.namespace}/{ref.name}" in self.node.tenant
        return f"admin/{ref.name}" in self.node.admin

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
            host_if = local.host.get(network) if local is not None else None
            if host_if is not None:  # on the host's end of its veth: counters read there
                out[ifname]["table"] = host_table_name(network, host_if)
                out[ifname]["netns"] = self.host_netns
                out[ifname]["hostInterface"] = host_if
                port = local.bridged.get(network) if local is not None else None
                if port is not None:
                    out[ifname]["bridge"] = port.bridge
        if local is not None:
            for ifname, (network, why) in local.unenforced.items():
                out[ifname] = {
                    "network": network,
                    "policies": self.node.policed(network),
                    "notEnforced": why,
                }
            if local.undoable and any(n not in local.host for n in self.node.local.get(key, {})):
                out["undoableBy"] = list(local.undoable)
        return out

    def tables(self) -> list[tuple[PodKey, str, str, str]]:
        """(pod, network, netns, table) of every table applied here (metrics read them; safe
        to call from another thread: it copies what it reads)."""
        applied = set(self.applied)
        out = []
        for key in list(self.local):
            for network in list(self.node.local.get(key, {})):
                where = self.where(key, network)
                if where is not None and where in applied:
                    out.append((key, network, *where))
        return out


# ---------------------------------------------------------------------- object readers


def name_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def namespace_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("namespace", ""))


def ref_of(kind: str, obj: Mapping[str, Any]) -> PolicyRef:
    """The PolicyRef of a policy object of `kind`."""
    if kind == "MultiNetworkPolicy":
        return PolicyRef(kind, name_of(obj), namespace_of(obj))
    return PolicyRef(kind, name_of(obj))


def local_key(obj: Mapping[str, Any]) -> PodKey:
    return (namespace_of(obj), name_of(obj))


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()}


def decode_tenant(obj: Mapping[str, Any]) -> tuple[model.MultiNetworkPolicy | None, str]:
    """The tenant's policy, or None and why it does not decode (the tenancy rule is judged
    apart: its answer changes with the cluster)."""
    policy, issues = model.decode_policy(obj, default_namespace=namespace_of(obj) or "default")
    if policy is not None:
        return policy, ""
    why = "; ".join(str(e) for e in issues.errors)
    log.warning("MultiNetworkPolicy %s/%s is not applied: %s", namespace_of(obj), name_of(obj), why)
    return None, why


def decode_admin(obj: Mapping[str, Any]) -> tuple[model.AdminNetworkPolicy | None, str]:
    """The admin's policy, or None and why it does not decode."""
    policy, issues = model.decode_admin_policy(obj)
    if policy is not None:
        return policy, ""
    why = "; ".join(str(e) for e in issues.errors)
    log.warning("CNIAdminNetworkPolicy %s is not applied: %s", name_of(obj), why)
    return None, why


@dataclass(frozen=True)
class Unusable:
    """A CNINetwork that does not parse: the tenancy rule lets no namespace name it."""

    message: str

    def admits(self, namespace: str, labels: Mapping[str, str] | None) -> str | None:
        return self.message


def cninetwork_rules(obj: Mapping[str, Any]) -> NamedNetwork | Unusable:
    """A CNINetwork as the tenancy rule reads it: its namespace rules. A `networkID`'s conf is
    on each node's disk and has no say in who may use it: a stand-in of the CNINetwork's type
    is parsed in its place, so the rule never waits on a file."""
    spec = obj.get("spec")
    conf = None
    if isinstance(spec, Mapping) and spec.get("networkID") is not None:
        kind = spec.get("type")
        plugins = [{"type": kind}] if isinstance(kind, str) else []
        conf = NamedNetwork("node conf", {"plugins": plugins}, ROOT, trusted=True)
    found = cninetwork(obj, conf)
    return found if isinstance(found, NamedNetwork) else Unusable(found.message)


class NadsInUse(Mapping[str, frozenset[str]]):
    """Per namespace, the NADs its pods' interfaces are on (the network-status annotations the
    pod watch brings, and this node's attachments): the other namespaces' NADs the tenancy rule
    lets its policies name. Read from the pods policy follows anyway rather than from every
    claim (a second cluster-wide watch): a tenant's policy selects its own namespace's pods only,
    so one naming another namespace's NAD has nothing to select until a pod of its namespace
    is on it, which is when it is applied; the local pod's attachment counts before its first
    table is written."""

    def __init__(self, pods: Mapping[PodKey, PodFacts]) -> None:
        self.pods = pods

    def __getitem__(self, namespace: str) -> frozenset[str]:
        pods = [facts for (ns, _), facts in self.pods.items() if ns == namespace]
        if not pods:
            raise KeyError(namespace)
        return frozenset(n for facts in pods for n in facts.networks if ":" not in n)

    def __iter__(self) -> Iterator[str]:
        return iter({ns for ns, _ in self.pods})

    def __len__(self) -> int:
        return len({ns for ns, _ in self.pods})


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
