"""The node's policy over every network its pods are on: the cluster's policies, namespace labels
and peers (every node's pods on each network), and this node's interfaces, kept in one
`NetworkTables` per network that a local interface is on. Pure: the agent feeds it events
(cnidra.nri.netpolicy) and applies the tables that changed. docs/network-policy.md.

A pod's interfaces on different networks are policed by different tables, one per network
(`table_name`): each table's base chains dispatch by interface name and accept what is not
theirs, so a packet passes only when the table of its interface's network lets it.

Peers come from the pods' `k8s.v1.cni.cncf.io/network-status` annotation, which cnidra writes
for every pod it attaches (on every node), each entry naming the network as `policy-for` does
under `POLICY_NETWORK_KEY`: one watch of pods gives their labels, named ports and addresses.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cnidra.api.constants import DRIVER_NAME
from cnidra.api.netpolicy import AdminNetworkPolicy, MultiNetworkPolicy
from cnidra.api.netpolicy_rules import NamedPort, PodOnNetwork, Ruleset
from cnidra.api.netpolicy_state import NetworkTables, PodKey

NETWORK_STATUS = "k8s.v1.cni.cncf.io/network-status"
# the key of a network-status entry that names its network as `policy-for` does
POLICY_NETWORK_KEY = f"{DRIVER_NAME}/policy-for"
TABLE_PREFIX = "cnidra_"
HOST_TABLE_PREFIX = "cnidra_h"  # the host's tables (a pod's are cnidra_ and 12 hex: no clash)
SPOOF_TABLE_PREFIX = "cnidra_s"  # a bridge port's anti-spoofing table (family bridge)
# a bridge whose nf_call_iptables cnidra turned on: an empty `bridge` table named for it (hex of
# its name), so that a restarted driver still knows to turn it off again
BRIDGE_MARK_PREFIX = "cnidra_m"  # (m, s and h are no hex digit: no pod table begins so)

Policy = MultiNetworkPolicy | AdminNetworkPolicy
Change = tuple[PodKey, str]  # a local pod, a network: that table changed


def table_name(network: str) -> str:
    """The nftables table of a network in a pod's namespace (a name nft takes whatever the
    network's key holds)."""
    return TABLE_PREFIX + hashlib.sha256(network.encode()).hexdigest()[:12]


def host_table_name(network: str, host_ifname: str) -> str:
    """The table of a pod's network enforced on the host's end of its veth (in the host's
    namespace, one per host veth: `cnidra_h` and 12 hex of the network and the veth)."""
    digest = hashlib.sha256(f"{network}\0{host_ifname}".encode()).hexdigest()[:12]
    return f"{HOST_TABLE_PREFIX}{digest}"


def spoof_table_name(network: str, port: str) -> str:
    """The anti-spoofing table (family `bridge`, in the host's namespace) of a pod's port on a
    bridge: `cnidra_s` and 12 hex of the network and the port."""
    digest = hashlib.sha256(f"{network}\0{port}".encode()).hexdigest()[:12]
    return f"{SPOOF_TABLE_PREFIX}{digest}"


def bridge_mark(bridge: str) -> str:
    """The marker table of a bridge whose nf_call_iptables cnidra turned on."""
    return BRIDGE_MARK_PREFIX + bridge.encode().hex()


def marked_bridge(table: str) -> str | None:
    """The bridge a marker table (`bridge_mark`) names; None for any other table."""
    if not table.startswith(BRIDGE_MARK_PREFIX):
        return None
    try:
        return bytes.fromhex(table[len(BRIDGE_MARK_PREFIX) :]).decode()
    except ValueError:
        return None


def family_of(table: str) -> str:
    """The nftables family of one of cnidra's tables, by its name."""
    return "bridge" if table.startswith((SPOOF_TABLE_PREFIX, BRIDGE_MARK_PREFIX)) else "inet"


def named_ports(spec: Mapping[str, Any]) -> tuple[NamedPort, ...]:
    """The pod's container ports that have a name (what a named port resolves to)."""
    found = []
    for container in spec.get("containers") or []:
        if not isinstance(container, Mapping):
            continue
        for port in container.get("ports") or []:
            if not isinstance(port, Mapping) or not port.get("name"):
                continue
            number = port.get("containerPort")
            if isinstance(number, int) and not isinstance(number, bool):
                protocol = str(port.get("protocol") or "TCP")
                found.append(NamedPort(str(port["name"]), protocol, number))
    return tuple(sorted(set(found), key=lambda p: (p.name, p.protocol, p.port)))


@dataclass(frozen=True)
class PodFacts:
    """What policy needs of one pod: its labels and ports, its addresses on each network."""

    namespace: str
    name: str
    labels: Mapping[str, str]
    ports: tuple[NamedPort, ...]
    networks: Mapping[str, tuple[str, ...]]  # policy network -> addresses there

    @property
    def key(self) -> PodKey:
        return (self.namespace, self.name)

    def on(self, network: str) -> PodOnNetwork:
        return PodOnNetwork(
            self.namespace,
            self.name,
            dict(self.labels),
            self.networks.get(network, ()),
            self.ports,
        )


def pod_facts(pod: Mapping[str, Any]) -> PodFacts | None:
    """A pod object's facts; None when it has no interface of cnidra's on a named network (its
    network-status lists none with `POLICY_NETWORK_KEY`), or is done (its addresses are free)."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return None
    try:
        entries = json.loads(annotations.get(NETWORK_STATUS) or "[]")
    except (ValueError, TypeError):
        return None
    networks: dict[str, tuple[str, ...]] = {}
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, Mapping) or not entry.get(POLICY_NETWORK_KEY):
            continue
        ips = tuple(str(ip) for ip in entry.get("ips") or [] if isinstance(ip, str))
        network = str(entry[POLICY_NETWORK_KEY])
        networks[network] = (*networks.get(network, ()), *ips)
    if not networks:
        return None
    labels = meta.get("labels") or {}
    return PodFacts(
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
        {str(k): str(v) for k, v in labels.items()},
        named_ports(pod.get("spec") or {}),
        networks,
    )


class NodePolicy:
    """Every table of this node's pods, by pod and network. Each event returns the (pod,
    network) tables that changed; `ruleset` gives one."""

    def __init__(self) -> None:
        self.tenant: dict[str, MultiNetworkPolicy] = {}
        self.admin: dict[str, AdminNetworkPolicy] = {}
        self.namespace_labels: dict[str, dict[str, str]] = {}
        self.pods: dict[PodKey, PodFacts] = {}
        self.local: dict[PodKey, dict[str, str]] = {}  # pod -> network -> interface
        self.networks: dict[str, NetworkTables] = {}

    # ------------------------------------------------------------------ reading

    def ruleset(self, key: PodKey, network: str) -> Ruleset | None:
        tables = self.networks.get(network)
        return tables.tables.get(key) if tables is not None else None

    def policed(self, network: str) -> list[str]:
        """The policies for `network` (refs), tenant and admin."""
        policies: list[Policy] = [*self.tenant.values(), *self.admin.values()]
        return sorted(p.ref for p in policies if any(t.key == network for t in p.targets))

    def applying(
        self, key: PodKey, network: str, labels: Mapping[str, str] | None = None
    ) -> list[str]:
        """The policies that select the pod on `network` (refs); `labels`: the pod's, when the
        watch may not know it (an interface policy is not enforced on)."""
        facts = self.pods.get(key)
        if facts is not None:
            labels = facts.labels
        if labels is None:
            return []
        ns_labels = self.namespace_labels.get(key[0], {})
        out = []
        policies: list[Policy] = [*self.tenant.values(), *self.admin.values()]
        for policy in policies:
            if not any(t.key == network for t in policy.targets):
                continue
            if isinstance(policy, MultiNetworkPolicy):
                chosen = policy.selects(key[0], labels)
            else:
                chosen = policy.selects(ns_labels, labels)
            if chosen:
                out.append(policy.ref)
        return sorted(out)

    # ------------------------------------------------------------------ events

    def set_policy(self, policy: Policy) -> set[Change]:
        if isinstance(policy, MultiNetworkPolicy):
            self.tenant[policy.ref] = policy
        else:
            self.admin[policy.ref] = policy
        return self._each(lambda t: t.set_policy(policy))

    def remove_policy(self, ref: str) -> set[Change]:
        if self.tenant.pop(ref, None) is None and self.admin.pop(ref, None) is None:
            return set()
        return self._each(lambda t: t.remove_policy(ref))

    def replace_policies(self, policies: Iterable[Policy], admin: bool) -> set[Change]:
        """The whole set of one kind, as a list read it: the ones not in it removed."""
        fresh = list(policies)
        changed: set[Change] = set()
        known = set(self.admin if admin else self.tenant)
        for gone in known - {p.ref for p in fresh}:
            changed |= self.remove_policy(gone)
        for policy in fresh:
            changed |= self.set_policy(policy)
        return changed

    def set_namespace(self, namespace: str, labels: Mapping[str, str]) -> set[Change]:
        if self.namespace_labels.get(namespace) == dict(labels):
            return set()
        self.namespace_labels[namespace] = dict(labels)
        return self._each(lambda t: t.set_namespace_labels(namespace, labels))

    def replace_namespaces(self, namespaces: Mapping[str, Mapping[str, str]]) -> set[Change]:
        changed: set[Change] = set()
        for gone in set(self.namespace_labels) - set(namespaces):
            changed |= self.set_namespace(gone, {})
            self.namespace_labels.pop(gone, None)
        for namespace, labels in namespaces.items():
            changed |= self.set_namespace(namespace, labels)
        return changed

    def set_pod(self, facts: PodFacts) -> set[Change]:
        """A pod of any node came or changed (its labels, ports or addresses)."""
        old = self.pods.get(facts.key)
        mine = self.local.get(facts.key, {})
        if old is not None and mine:  # the watch may lag the attach: keep what the ADD gave
            missing = {
                n: old.networks[n] for n in mine if n not in facts.networks and n in old.networks
            }
            if missing:
                facts = PodFacts(
                    facts.namespace,
                    facts.name,
                    facts.labels,
                    facts.ports,
                    {**facts.networks, **missing},
                )
        if old == facts:
            return set()
        self.pods[facts.key] = facts
        changed: set[Change] = set()
        for network, tables in self.networks.items():
            if network in facts.networks or network in mine:
                found = tables.set_pod(facts.on(network))
            elif key_in(tables, facts.key):
                found = tables.remove_pod(facts.key)
            else:
                continue
            changed |= {(k, network) for k in found}
        return changed

    def remove_pod(self, key: PodKey) -> set[Change]:
        """A pod went (deleted, or done); a local one keeps its tables until `remove_local`."""
        if self.pods.pop(key, None) is None:
            return set()
        changed: set[Change] = set()
        for network, tables in self.networks.items():
            if key in self.local and network in self.local[key]:
                continue  # still attached here: its record decides
            if key_in(tables, key):
                changed |= {(k, network) for k in tables.remove_pod(key)}
        return changed

    def replace_pods(self, pods: Iterable[PodFacts]) -> set[Change]:
        fresh = {p.key: p for p in pods}
        changed: set[Change] = set()
        for gone in set(self.pods) - set(fresh) - set(self.local):
            changed |= self.remove_pod(gone)
        for facts in fresh.values():
            changed |= self.set_pod(facts)
        return changed

    def set_local(self, facts: PodFacts, network: str, ifname: str) -> set[Change]:
        """A pod of this node has interface `ifname` on `network` (at attach, or read back from
        the sandbox records after a restart). `facts`: what is known of it now (at attach:
        its labels from the runtime and its addresses from the ADD); a pod the watch knows
        keeps the watch's facts, with the addresses merged."""
        known = self.pods.get(facts.key)
        if known is not None:
            networks = {**facts.networks, **known.networks}
            facts = PodFacts(
                known.namespace, known.name, known.labels, known.ports or facts.ports, networks
            )
        self.pods[facts.key] = facts
        self.local.setdefault(facts.key, {})[network] = ifname
        tables = self.networks.get(network)
        if tables is None:
            tables = NetworkTables(
                network,
                {},
                [p.on(network) for p in self.pods.values() if network in p.networks],
                self.namespace_labels,
                self.tenant.values(),
                self.admin.values(),
                table=table_name(network),
            )
            self.networks[network] = tables
        tables.set_pod(facts.on(network))
        return {(k, network) for k in tables.set_local(facts.key, ifname)} | {(facts.key, network)}

    def remove_local(self, key: PodKey, network: str | None = None) -> None:
        """The pod's interface on `network` (None: every one) is gone from this node."""
        networks = self.local.get(key, {})
        for net in [network] if network is not None else list(networks):
            networks.pop(net, None)
            tables = self.networks.get(net)
            if tables is None:
                continue
            tables.local.pop(key, None)
            tables.tables.pop(key, None)
            if not tables.local:
                del self.networks[net]
        if not networks:
            self.local.pop(key, None)

    # ------------------------------------------------------------------ helpers

    def _each(self, event: Any) -> set[Change]:
        changed: set[Change] = set()
        for network, tables in self.networks.items():
            changed |= {(k, network) for k in event(tables)}
        return changed


def key_in(tables: NetworkTables, key: PodKey) -> bool:
    return key in tables.pods
