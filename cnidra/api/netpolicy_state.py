"""The node's policy tables for one network, kept current event by event. Pure: no I/O (the agent
applies what changed through cnidra.datapath.netpolicy). docs/network-policy.md.

Recompiling every pod on every change costs about a second for 1,000 pods (bench/netpolicy.py),
so each change recompiles only the tables it can touch:

- **a pod's addresses change** (nothing else): its old addresses are replaced by its new ones in
  every set that holds them, without compiling anything (a set holds a pod's address only as
  the pod's: pods' sets hold plain addresses and `address . protocol . port`, ipBlock sets
  CIDRs); when it gains or loses an address family, as a pod change below;
- **a pod comes, goes, or its ports change**: its own table, and the tables of the pods
  selected by a policy with a rule whose peers match it before or after (or that allows every
  peer to a named port: those tables list every pod with the port);
- **a pod's labels change** (nothing else): its own table, and the tables of the pods selected
  by a policy with a rule that matches it before and not after, or after and not before;
- **a policy comes, goes or changes**: the tables of the pods it selects, before or after;
- **a namespace's labels change**: every table (rare; namespace selectors are everywhere).

`tables` is always what compiling every local pod from scratch would give (a hypothesis test
holds it to that, tests/api/test_netpolicy_state.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from cnidra.api.netpolicy import AdminNetworkPolicy, AdminRule, MultiNetworkPolicy, Rule
from cnidra.api.netpolicy_rules import (
    TABLE,
    NetworkView,
    NftSet,
    PodInterface,
    PodOnNetwork,
    Ruleset,
    compile_pod,
)

PodKey = tuple[str, str]  # namespace, name


def key_of(pod: PodOnNetwork) -> PodKey:
    return (pod.namespace, pod.name)


class NetworkTables:
    """The tables of this node's pods on one network (`local`: pod key -> interface name)."""

    def __init__(
        self,
        network: str,
        local: Mapping[PodKey, str],
        pods: Iterable[PodOnNetwork] = (),
        namespace_labels: Mapping[str, Mapping[str, str]] | None = None,
        tenant: Iterable[MultiNetworkPolicy] = (),
        admin: Iterable[AdminNetworkPolicy] = (),
        table: str = TABLE,
    ) -> None:
        self.network = network
        self.table = table
        self.local = dict(local)
        self.pods: dict[PodKey, PodOnNetwork] = {key_of(p): p for p in pods}
        self.namespace_labels = {k: dict(v) for k, v in (namespace_labels or {}).items()}
        self.tenant = {p.ref: p for p in tenant if self._for_us(p)}
        self.admin = {p.ref: p for p in admin if self._for_us(p)}
        self.tables: dict[PodKey, Ruleset] = {}
        self.compiles = 0  # tables compiled so far (what the benchmark counts)
        self._recompile(set(self.local))

    # ------------------------------------------------------------------- events

    def set_pod(self, pod: PodOnNetwork) -> set[PodKey]:
        """A pod came or changed; the keys of the tables that changed."""
        key = key_of(pod)
        old = self.pods.get(key)
        self.pods[key] = pod
        if old is not None and (old.labels, old.ports) == (pod.labels, pod.ports):
            moved = self._move(old, pod)
            if moved is not None:
                return moved
        if old is not None and (old.addresses, old.ports) == (pod.addresses, pod.ports):
            affected = self._naming(pod, before=old)  # its labels alone changed
        else:
            affected = self._naming(pod) | (self._naming(old) if old is not None else set())
        return self._recompile(affected | ({key} & set(self.local)))

    def remove_pod(self, key: PodKey) -> set[PodKey]:
        old = self.pods.pop(key, None)
        self.tables.pop(key, None)
        self.local.pop(key, None)
        if old is None:
            return set()
        return self._recompile(self._naming(old))

    def set_local(self, key: PodKey, ifname: str) -> set[PodKey]:
        """A pod of this node got its interface on the network (its table is made)."""
        self.local[key] = ifname
        return self._recompile({key})

    def set_policy(self, policy: MultiNetworkPolicy | AdminNetworkPolicy) -> set[PodKey]:
        """A policy came or changed (one no longer for this network is removed)."""
        old: MultiNetworkPolicy | AdminNetworkPolicy | None
        if isinstance(policy, MultiNetworkPolicy):
            old = self.tenant.pop(policy.ref, None)
            if self._for_us(policy):
                self.tenant[policy.ref] = policy
        else:
            old = self.admin.pop(policy.ref, None)
            if self._for_us(policy):
                self.admin[policy.ref] = policy
        affected = self._selected_by(policy) | (self._selected_by(old) if old else set())
        return self._recompile(affected)

    def remove_policy(self, ref: str) -> set[PodKey]:
        """`ref`: a MultiNetworkPolicy's `ns/name`, an admin policy's `admin/name`."""
        old: MultiNetworkPolicy | AdminNetworkPolicy | None = self.tenant.pop(ref, None)
        if old is None:
            old = self.admin.pop(ref, None)
        return self._recompile(self._selected_by(old) if old else set())

    def set_namespace_labels(self, namespace: str, labels: Mapping[str, str]) -> set[PodKey]:
        self.namespace_labels[namespace] = dict(labels)
        return self._recompile(set(self.local))

    # ------------------------------------------------------------------ helpers

    def view(self) -> NetworkView:
        return NetworkView(
            self.network, tuple(self.pods[k] for k in sorted(self.pods)), self.namespace_labels
        )

    def _for_us(self, policy: MultiNetworkPolicy | AdminNetworkPolicy) -> bool:
        return any(t.key == self.network for t in policy.targets)

    def _recompile(self, keys: set[PodKey]) -> set[PodKey]:
        keys = {k for k in keys if k in self.local and k in self.pods}
        if not keys:
            return set()
        view = self.view()
        tenant = list(self.tenant.values())
        admin = list(self.admin.values())
        changed = set()
        for key in keys:
            table = compile_pod(
                self.pods[key], [PodInterface(self.local[key], view)], tenant, admin, self.table
            )
            self.compiles += 1
            if self.tables.get(key) != table:
                self.tables[key] = table
                changed.add(key)
        return changed

    def _selected_by(self, policy: MultiNetworkPolicy | AdminNetworkPolicy) -> set[PodKey]:
        out = set()
        for key in self.local:
            pod = self.pods.get(key)
            if pod is None:
                continue
            if isinstance(policy, MultiNetworkPolicy):
                if policy.selects(pod.namespace, pod.labels):
                    out.add(key)
            elif policy.selects(self.namespace_labels.get(pod.namespace, {}), pod.labels):
                out.add(key)
        return out

    def _naming(self, peer: PodOnNetwork, before: PodOnNetwork | None = None) -> set[PodKey]:
        """The local pods whose tables may list `peer`: those selected by a policy with a rule
        whose peers match it, or that allows every peer to a named port. With `before` (the
        same pod with other labels, its addresses and ports unchanged): only those selected by
        a policy with a rule that matches one of the two and not the other."""
        out: set[PodKey] = set()
        policies: list[MultiNetworkPolicy | AdminNetworkPolicy] = [
            *self.tenant.values(),
            *self.admin.values(),
        ]
        for policy in policies:
            for rule in (*policy.ingress, *policy.egress):
                now = self._names(policy, rule, peer)
                if now if before is None else now != self._names(policy, rule, before):
                    out |= self._selected_by(policy)
                    break
        return out

    def _names(
        self,
        policy: MultiNetworkPolicy | AdminNetworkPolicy,
        rule: Rule | AdminRule,
        peer: PodOnNetwork,
    ) -> bool:
        """Whether `rule` of `policy` lists `peer` (in a set of pods' addresses or ports)."""
        ns_labels = self.namespace_labels.get(peer.namespace, {})
        if isinstance(rule, AdminRule):
            return any(
                p.namespace_selector is not None
                and p.pod_selector is not None
                and p.namespace_selector.matches(ns_labels)
                and p.pod_selector.matches(peer.labels)
                for p in rule.peers
            )
        assert isinstance(policy, MultiNetworkPolicy)
        if not rule.peers:  # every peer: pods are listed only for a named port (egress)
            return any(isinstance(p.port, str) for p in rule.ports)
        return any(
            p.ip_block is None
            and (
                peer.namespace == policy.namespace
                if p.namespace_selector is None
                else p.namespace_selector.matches(ns_labels)
            )
            and (p.pod_selector is None or p.pod_selector.matches(peer.labels))
            for p in rule.peers
        )

    def _move(self, old: PodOnNetwork, new: PodOnNetwork) -> set[PodKey] | None:
        """Only the addresses changed: each old one replaced by the new one of its family in
        every set that holds it. None when that cannot be done by replacement (a family
        gained or lost, or two addresses of one family)."""
        olds = {v: old.ips(v) for v in (4, 6)}
        news = {v: new.ips(v) for v in (4, 6)}
        if any(len(olds[v]) != len(news[v]) or len(olds[v]) > 1 for v in (4, 6)):
            return None
        swap = {o[0]: n[0] for v in (4, 6) if (o := olds[v]) and (n := news[v])}
        swap = {a: b for a, b in swap.items() if a != b}
        changed = set()
        for key, table in self.tables.items():
            sets = tuple(_swapped(s, swap) for s in table.sets)
            if sets != table.sets:
                self.tables[key] = replace(table, sets=sets)
                changed.add(key)
        return changed


def _swapped(found: NftSet, swap: Mapping[str, str]) -> NftSet:
    if found.interval or not swap:
        return found
    elements = set()
    hit = False
    for element in found.elements:
        address, sep, rest = element.partition(" . ")
        if address in swap:
            elements.add(swap[address] + sep + rest)
            hit = True
        else:
            elements.add(element)
    return replace(found, elements=frozenset(elements)) if hit else found
