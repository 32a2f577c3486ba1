"""Network policy compiled to nftables for one pod. Pure: no I/O (cnidra.datapath.netpolicy
applies what this writes). docs/network-policy.md.

One table per pod and network, `inet cnidra_<12 hex of the network>`
(cnidra.api.netpolicy_node.table_name), in the namespace where it is enforced (`host_side`
moves it to the host's end of a routed veth). For each of the pod's
interfaces on a network with policy (numbered `if0`, `if1`, ... in the order given):

    chain input  (hook input)   iifname "net1" jump if0_in
    chain output (hook output)  oifname "net1" jump if0_out
    chain if0_in   ct state established,related accept
                   neighbour discovery and DHCP replies accept          (always allowed)
                   jump if0_in_admin                                    (the admin tier)
                   jump if0_in_tenant, then drop   -- or accept when no policy isolates it
    chain if0_in_admin   one rule per admin rule and peer set, in priority order:
                         accept (Allow), drop (Deny), return (Pass: on to the tenant tier)
    chain if0_in_tenant  one accept per MultiNetworkPolicy rule and peer set

Peers are named sets, so a pod coming, going or changing its address changes set elements
only (`Ruleset.update_from`), never a chain: `<chain>_<n>_p4`/`_p6` hold the selected pods'
addresses, `_b4`/`_b6` (interval sets) ipBlocks and admin networks, `_n4`/`_n6` the
address . protocol . port of a named port on each peer pod (egress names a port on the peer).
Every rule counts (`counter`) and says what it comes from (`comment "ns/name ingress[0]"`).
A change of policy rewrites the rules in place and keeps the sets both versions have; the ones
no rule names any more go in a batch after it (`Ruleset.leftovers`), because a packet that
began on the old rules may look a set up just after the commit, and a set deleted in the
swap's own batch then drops it (the streaming test in tests/datapath/test_netpolicy.py lost
about one allowed datagram in 2,000 that way).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from cnidra.api.netpolicy import (
    Action,
    AdminNetworkPolicy,
    AdminPeer,
    AdminRule,
    IPNetwork,
    MultiNetworkPolicy,
    Peer,
    PortSpec,
    Rule,
    ordered_admin,
)

TABLE = "cnidra"
FAMILY = "inet"
# always allowed in both directions: neighbour discovery and router discovery (IPv6 needs them
# to reach anyone; IPv4's ARP is not IP and never meets an inet table), DHCP and DHCPv6
ND_TYPES = (
    "nd-router-solicit",
    "nd-router-advert",
    "nd-neighbor-solicit",
    "nd-neighbor-advert",
)
ALWAYS_IN = (
    f"icmpv6 type {{ {', '.join(ND_TYPES)} }} accept",
    "udp sport 67 udp dport 68 accept",
    "udp sport 547 udp dport 546 accept",
)
ALWAYS_OUT = (
    f"icmpv6 type {{ {', '.join(ND_TYPES)} }} accept",
    "udp sport 68 udp dport 67 accept",
    "udp sport 546 udp dport 547 accept",
)
_PROTO = {"TCP": "tcp", "UDP": "udp", "SCTP": "sctp"}


class UnenforceableInterface(ValueError):
    """An interface policy cannot be written for; the caller fails closed (refuses the
    interface, flags the policy) rather than leave it unpoliced."""


# ---------------------------------------------------------------------------- the input


@dataclass(frozen=True)
class NamedPort:
    """A container port of a pod: what a named port in a policy resolves to."""

    name: str
    protocol: str
    port: int


@dataclass(frozen=True)
class PodOnNetwork:
    """A pod attached to a network: its labels, and its addresses on that network (from the
    claim status and network-status; an address with or without its prefix length)."""

    namespace: str
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    addresses: tuple[str, ...] = ()
    ports: tuple[NamedPort, ...] = ()

    def resolve(self, spec: PortSpec) -> list[tuple[str, int]]:
        """(protocol, port) of a named port on this pod; none when it has no such port."""
        return [
            (p.protocol, p.port)
            for p in self.ports
            if p.name == spec.port and (not spec.protocol or p.protocol == spec.protocol)
        ]

    def ips(self, version: int) -> list[str]:
        return [ip for v, ip in map(_address, self.addresses) if v == version]


@lru_cache(maxsize=65536)
def _address(text: str) -> tuple[int, str]:
    """An address as status reports it (with or without its prefix length): its family and
    its text as nft writes it. Cached: every table that names a pod reads its addresses."""
    ip = ipaddress.ip_interface(text).ip
    return ip.version, str(ip)


@dataclass(frozen=True)
class NetworkView:
    """Everything on one network that policy needs: its key (cnidra.api.netpolicy.Target.key),
    the pods on it (every node's), and the labels of their namespaces."""

    key: str
    pods: tuple[PodOnNetwork, ...]
    namespace_labels: Mapping[str, Mapping[str, str]]

    def labels_of(self, namespace: str) -> Mapping[str, str]:
        return self.namespace_labels.get(namespace, {})


@dataclass(frozen=True)
class PodInterface:
    ifname: str
    network: NetworkView


# --------------------------------------------------------------------------- the output


@dataclass(frozen=True)
class NftSet:
    name: str
    type: str
    interval: bool
    elements: frozenset[str]

    def declaration(self) -> str:
        flags = "; flags interval" if self.interval else ""
        elements = f"; elements = {{ {', '.join(sorted(self.elements))} }}" if self.elements else ""
        return f"set {self.name} {{ type {self.type}{flags}{elements}; }}"


@dataclass(frozen=True)
class Chain:
    name: str
    rules: tuple[str, ...]
    hook: str | None = None  # a base chain's hook

    def declaration(self) -> str:
        head = f"type filter hook {self.hook} priority filter; policy accept; " if self.hook else ""
        body = "".join(f"{r}; " for r in self.rules)
        return f"chain {self.name} {{ {head}{body}}}"


@dataclass(frozen=True)
class Ruleset:
    """One pod's table. `script()` replaces it whole in one transaction; `update_from(old)` is
    what turns `old` into it, element changes alone when only sets changed."""

    chains: tuple[Chain, ...]
    sets: tuple[NftSet, ...]
    table: str = TABLE
    # False: no policy governs the pod on its interfaces, and the table accepts everything, as
    # no table does (so a new interface needs none yet); not part of what a table is
    isolating: bool = field(default=True, compare=False)

    @property
    def rule_count(self) -> int:
        return sum(len(c.rules) for c in self.chains)

    def shape(self) -> tuple[object, ...]:
        """All but the sets' elements: when two rulesets' shapes are equal, sets alone differ."""
        return (self.table, self.chains, tuple((s.name, s.type, s.interval) for s in self.sets))

    def script(self) -> str:
        """`nft -f` input: the table created (so that deleting it cannot fail), deleted, and
        written again, in one batch: the kernel swaps it in one transaction. For a first
        apply; a table that exists is changed by `update_from` instead."""
        lines = [
            f"add table {FAMILY} {self.table}",
            f"delete table {FAMILY} {self.table}",
            f"table {FAMILY} {self.table} {{",
            *(f"  {s.declaration()}" for s in self.sets),
            *(f"  {c.declaration()}" for c in self.chains),
            "}",
        ]
        return "\n".join(lines) + "\n"

    def update_from(self, old: Ruleset | None) -> str:
        """The smallest `nft -f` batch that turns `old` (what was applied) into this ruleset:
        "" when nothing changed; set element changes when only sets did; else the rules
        rewritten in place, sets kept (`_rewrite`). `old` None (a first apply, a resync):
        the whole table written again (`script`). Then `leftovers(old)`, in a batch of its
        own."""
        if old is None or old.table != self.table:
            return self.script()
        olds = {s.name: s for s in old.sets}
        kept = self._kept(old)
        elements: list[str] = []
        for new in self.sets:
            if new.name in kept:
                elements += self._element_changes(olds[new.name], new)
        if old.shape() == self.shape():
            return "\n".join(elements) + "\n" if elements else ""
        return self._rewrite(old, kept, elements)

    def _element_changes(self, before: NftSet, new: NftSet) -> list[str]:
        where = f"{FAMILY} {self.table} {new.name}"
        gone = before.elements - new.elements
        came = new.elements - before.elements
        lines = []
        if gone:  # an interval set's elements are the collapsed networks: each one exactly
            lines.append(f"delete element {where} {{ {', '.join(sorted(gone))} }}")
        if came:
            lines.append(f"add element {where} {{ {', '.join(sorted(came))} }}")
        return lines

    def _kept(self, old: Ruleset) -> set[str]:
        """The sets both rulesets have, alike but for their elements."""
        olds = {s.name: (s.type, s.interval) for s in old.sets}
        return {s.name for s in self.sets if olds.get(s.name) == (s.type, s.interval)}

    def _rewrite(self, old: Ruleset, kept: set[str], elements: list[str]) -> str:
        """Every rule replaced in one batch, the sets both rulesets have kept (their elements
        changed). A new set is added and flushed before it is filled, so one left behind by an
        earlier update (`leftovers`) starts empty. Chains only the old one has are deleted;
        sets only the old one has are not: that is `leftovers`, a batch of its own after this
        one (a packet that began on the old rules just before the commit may still look one
        up just after it; a set deleted in the same batch would miss, and drop it)."""
        table = f"{FAMILY} {self.table}"
        chains = {c.name: c for c in self.chains}
        lines = [f"flush table {table}"]
        lines += [
            f"delete chain {table} {c.name}"
            for c in old.chains
            if c.name not in chains or chains[c.name].hook != c.hook
        ]
        for new in self.sets:
            if new.name in kept:
                continue
            flags = "; flags interval" if new.interval else ""
            lines.append(f"add set {table} {new.name} {{ type {new.type}{flags}; }}")
            lines.append(f"flush set {table} {new.name}")
            if new.elements:
                lines.append(
                    f"add element {table} {new.name} {{ {', '.join(sorted(new.elements))} }}"
                )
        lines += [
            f"table {table} {{",
            *(f"  {c.declaration()}" for c in self.chains),
            "}",
            *elements,
        ]
        return "\n".join(lines) + "\n"

    def leftovers(self, old: Ruleset | None) -> str:
        """After `update_from(old)` was applied: the batch deleting the sets only `old` had
        ("" when none), which no rule names any more."""
        if old is None or old.table != self.table or old.shape() == self.shape():
            return ""
        kept = self._kept(old)
        table = f"{FAMILY} {self.table}"
        lines = [f"delete set {table} {s.name}" for s in old.sets if s.name not in kept]
        return "\n".join(lines) + "\n" if lines else ""


def _check_ifname(ifname: str) -> None:
    if not ifname or any(c not in _COMMENT_SAFE or c == " " for c in ifname):
        # the rule would name another interface (or none): refuse, never leave it open
        raise UnenforceableInterface(
            f"interface {ifname!r}: its name holds characters an nft rule cannot "
            "match exactly (letters, digits and ._-/:()[],=@+ only)"
        )


def host_side(ruleset: Ruleset, host_ifname: str, table: str) -> Ruleset:
    """A pod's table (one interface, as `compile_pod` writes it for the pod's namespace) moved
    to the host's side of its routed veth (`host_ifname`, the ptp plugin's): the same chains
    and sets, dispatched from the host's hooks. What reaches the pod leaves the host by the
    veth (forward, or output from the host itself): its ingress; what the pod sends comes in
    by it (forward, or input to the host): its egress. A pod cannot undo it: the table is not
    in its namespace. UnenforceableInterface for a name nft cannot match exactly."""
    _check_ifname(host_ifname)
    ins = [r.split(" jump ", 1)[1] for c in ruleset.chains if c.hook == "input" for r in c.rules]
    outs = [r.split(" jump ", 1)[1] for c in ruleset.chains if c.hook == "output" for r in c.rules]
    if len(ins) != 1 or len(outs) != 1:
        raise ValueError("host_side moves a table of one interface")
    name = _quote(host_ifname)
    base = (
        Chain(
            "forward",
            (f"oifname {name} jump {ins[0]}", f"iifname {name} jump {outs[0]}"),
            "forward",
        ),
        Chain("input", (f"iifname {name} jump {outs[0]}",), "input"),
        Chain("output", (f"oifname {name} jump {ins[0]}",), "output"),
    )
    inner = tuple(c for c in ruleset.chains if c.hook is None)
    return Ruleset(base + inner, ruleset.sets, table, ruleset.isolating)


@dataclass(frozen=True)
class BridgePort:
    """A pod's interface on a bridge as the bridge plugin's CNI result gives it: the bridge,
    the host's end of the pod's veth (a port of the bridge), the pod's MAC and its addresses on
    the network. What the host-side tables of a bridge interface key on."""

    bridge: str
    port: str
    mac: str
    addresses: tuple[str, ...]

    def ips(self, version: int) -> list[str]:
        """The pod's addresses of one family, as nft writes them; IPv6 with the pod's
        link-local address (EUI-64 of its MAC, the kernel's default), which the anti-spoofing
        table lets it use and the policy keys on like the others."""
        found = [ip for v, ip in map(_address, self.addresses) if v == version]
        if version == 6:
            found.append(link_local(self.mac))
        return sorted(set(found))


_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")


def link_local(mac: str) -> str:
    """The EUI-64 link-local IPv6 address of `mac` (what a veth in a pod's namespace gets
    unless its addr_gen_mode was changed)."""
    octets = [int(o, 16) for o in mac.split(":")]
    octets[0] ^= 0x02
    eui = bytes([*octets[:3], 0xFF, 0xFE, *octets[3:]])
    return str(ipaddress.IPv6Address(b"\xfe\x80" + bytes(6) + eui))


def _listed(value: Any) -> list[Any]:
    """A list a plugin's answer holds, or none when it holds something else there."""
    return value if isinstance(value, list) else []


def bridge_port(plugin: Mapping[str, Any], result: Mapping[str, Any] | None) -> BridgePort | None:
    """The pod's port on its bridge from the bridge plugin's config and CNI result, or None
    when the result does not say enough to key host-side rules on the pod (no single host veth
    besides the bridge, no MAC of the pod's interface, no address), or when the network trunks
    VLANs to the pod (`vlanTrunk`: the pod sends tagged frames, which br_netfilter does not
    hand to the `inet` hooks): such an interface is enforced in the pod's namespace."""
    if not result or plugin.get("vlanTrunk"):
        return None
    bridge = str(plugin.get("bridge") or "cni0")  # the plugin's default
    interfaces = [i for i in _listed(result.get("interfaces")) if isinstance(i, Mapping)]
    hosts = [
        i["name"]
        for i in interfaces
        if isinstance(i.get("name"), str) and i["name"] and not i.get("sandbox")
        and i["name"] != bridge
    ]  # fmt: skip
    ips = [
        ip
        for ip in _listed(result.get("ips"))
        if isinstance(ip, Mapping) and isinstance(ip.get("address"), str)
    ]
    pod_ifs = {n for ip in ips if isinstance(n := ip.get("interface"), int)}
    sandboxed = [
        i for n, i in enumerate(interfaces) if i.get("sandbox") and (n in pod_ifs or not pod_ifs)
    ]
    if len(hosts) != 1 or len(sandboxed) != 1 or not ips:
        return None
    mac = sandboxed[0].get("mac")
    mac = mac.lower() if isinstance(mac, str) else ""
    try:
        addresses = tuple(sorted({str(ipaddress.ip_interface(ip["address"])) for ip in ips}))
    except ValueError:
        return None
    if not _MAC.fullmatch(mac):
        return None
    return BridgePort(bridge, hosts[0], mac, addresses)


def bridge_host_side(ruleset: Ruleset, port: BridgePort, table: str) -> Ruleset:
    """A pod's table (one interface, as `compile_pod` writes it) moved to the host for a pod on
    a bridge: the same chains and sets, dispatched from the host's hooks by the pod's addresses,
    because br_netfilter hands bridged frames to the `inet` hooks with the bridge, not the port,
    as their interface (docs/network-policy.md). What is sent to one of the pod's addresses,
    bridged or routed (forward) or from the host itself (output), is its ingress; what comes
    from one (forward, or input to the host) its egress. The anti-spoofing table
    (`anti_spoof_script`) keeps those addresses the pod's. UnenforceableInterface for a name
    nft cannot match exactly."""
    _check_ifname(port.port)
    _check_ifname(port.bridge)
    ins = [r.split(" jump ", 1)[1] for c in ruleset.chains if c.hook == "input" for r in c.rules]
    outs = [r.split(" jump ", 1)[1] for c in ruleset.chains if c.hook == "output" for r in c.rules]
    if len(ins) != 1 or len(outs) != 1:
        raise ValueError("bridge_host_side moves a table of one interface")
    to_pod: list[str] = []
    from_pod: list[str] = []
    for version, family in ((4, "ip"), (6, "ip6")):
        ips = port.ips(version)
        if ips:
            group = f"{{ {', '.join(ips)} }}"
            to_pod.append(f"{family} daddr {group} jump {ins[0]}")
            from_pod.append(f"{family} saddr {group} jump {outs[0]}")
    base = (
        Chain("forward", (*to_pod, *from_pod), "forward"),
        Chain("input", tuple(from_pod), "input"),
        Chain("output", tuple(to_pod), "output"),
    )
    inner = tuple(c for c in ruleset.chains if c.hook is None)
    return Ruleset(base + inner, ruleset.sets, table, ruleset.isolating)


BRIDGE_FAMILY = "bridge"


def anti_spoof_script(port: BridgePort, table: str) -> str:
    """`nft -f` input writing (in one transaction) the `bridge` table that keeps a pod on a
    bridge to its own addresses: what enters the bridge by its port must carry the pod's MAC,
    its IPv4 source (0.0.0.0 for DHCP), its IPv6 source (its link-local, `::` for duplicate
    address detection), an ARP sender and a neighbour advertisement's target of its own, and no
    VLAN tag. Stateless (the `bridge` family has no conntrack on kernels without
    CONFIG_NF_CONNTRACK_BRIDGE): without it a pod could take a peer's address and be policed as
    that peer. UnenforceableInterface for a port name nft cannot match exactly."""
    _check_ifname(port.port)
    if not _MAC.fullmatch(port.mac):
        raise UnenforceableInterface(f"the pod's MAC {port.mac!r} is not one nft can match")
    at = f"iifname {_quote(port.port)}"
    v4 = ", ".join(["0.0.0.0", *port.ips(4)])
    v6s = port.ips(6)
    v6 = ", ".join(["::", *v6s])
    targets = ", ".join(f"0x{int(ipaddress.IPv6Address(ip)):032x}" for ip in v6s)

    def drop(match: str, why: str) -> str:
        return f"{at} {match} counter drop comment {_quote(f'anti-spoof: {why}')}"

    rules = (
        drop(f"ether saddr != {port.mac}", "not the pod's MAC"),
        drop("ether type { 8021q, 8021ad }", "a VLAN tag"),
        drop(f"meta protocol ip ip saddr != {{ {v4} }}", "not the pod's IPv4 source"),
        drop(f"meta protocol arp arp saddr ip != {{ {v4} }}", "not the pod's ARP sender"),
        drop(f"meta protocol arp arp saddr ether != {port.mac}", "not the pod's ARP MAC"),
        drop(f"meta protocol ip6 ip6 saddr != {{ {v6} }}", "not the pod's IPv6 source"),
        drop(
            f"icmpv6 type nd-neighbor-advert @th,64,128 != {{ {targets} }}",
            "a neighbour advert for another's address",
        ),
    )
    chain = Chain("prerouting", rules, "prerouting")
    return (
        f"add table {BRIDGE_FAMILY} {table}\n"
        f"delete table {BRIDGE_FAMILY} {table}\n"
        f"table {BRIDGE_FAMILY} {table} {{\n  {chain.declaration()}\n}}\n"
    )


def delete_script(table: str = TABLE, family: str = FAMILY) -> str:
    """Removes the pod's table, whether or not it exists."""
    return f"add table {family} {table}\ndelete table {family} {table}\n"


# -------------------------------------------------------------------------- compiling


@dataclass(frozen=True)
class _Match:
    """Who a rule's peers are, ready for sets: pod addresses, CIDRs, or everyone."""

    pods: tuple[PodOnNetwork, ...] = ()
    cidrs: tuple[IPNetwork, ...] = ()
    has_selectors: bool = False
    everyone: bool = False


def _pods_of_tenant_peer(
    peer: Peer, policy: MultiNetworkPolicy, view: NetworkView
) -> list[PodOnNetwork]:
    found = []
    for pod in view.pods:
        if peer.namespace_selector is None:
            if pod.namespace != policy.namespace:
                continue
        elif not peer.namespace_selector.matches(view.labels_of(pod.namespace)):
            continue
        if peer.pod_selector is not None and not peer.pod_selector.matches(pod.labels):
            continue
        found.append(pod)
    return found


def _tenant_match(rule: Rule, policy: MultiNetworkPolicy, view: NetworkView) -> _Match:
    if not rule.peers:
        return _Match(pods=view.pods, everyone=True)
    pods: dict[tuple[str, str], PodOnNetwork] = {}
    cidrs: list[IPNetwork] = []
    selectors = False
    for peer in rule.peers:
        if peer.ip_block is not None:
            cidrs.extend(peer.ip_block.networks())
            continue
        selectors = True
        for pod in _pods_of_tenant_peer(peer, policy, view):
            pods[(pod.namespace, pod.name)] = pod
    return _Match(tuple(pods[k] for k in sorted(pods)), tuple(cidrs), selectors)


def _admin_match(peers: Sequence[AdminPeer], view: NetworkView) -> _Match:
    pods: dict[tuple[str, str], PodOnNetwork] = {}
    cidrs: list[IPNetwork] = []
    selectors = False
    for peer in peers:
        cidrs.extend(peer.cidrs)
        if peer.namespace_selector is None or peer.pod_selector is None:
            continue
        selectors = True
        for pod in view.pods:
            if peer.namespace_selector.matches(
                view.labels_of(pod.namespace)
            ) and peer.pod_selector.matches(pod.labels):
                pods[(pod.namespace, pod.name)] = pod
    return _Match(tuple(pods[k] for k in sorted(pods)), tuple(cidrs), selectors)


def _collapsed(cidrs: Iterable[IPNetwork], version: int) -> frozenset[str]:
    nets = [c for c in cidrs if c.version == version]
    return frozenset(str(n) for n in ipaddress.collapse_addresses(nets))  # type: ignore[type-var]


def _port_clauses(ports: Sequence[PortSpec], receiver: PodOnNetwork | None) -> list[str] | None:
    """nft matches for numbered ports (and named ones resolved on `receiver`): [""] for every
    port, None when the ports resolve to nothing (the rule can match nothing)."""
    if not ports:
        return [""]
    by_proto: dict[str, list[str]] = {}
    whole: list[str] = []
    for spec in ports:
        if spec.port is None:
            whole.append(spec.protocol)
        elif isinstance(spec.port, int):
            value = f"{spec.port}-{spec.end_port}" if spec.end_port else str(spec.port)
            by_proto.setdefault(spec.protocol, []).append(value)
        elif receiver is not None:
            for proto, number in receiver.resolve(spec):
                by_proto.setdefault(proto, []).append(str(number))
    clauses = [f"meta l4proto {_PROTO[p]}" for p in sorted(set(whole))]
    for proto in sorted(by_proto):
        if proto in whole:
            continue
        values = sorted(set(by_proto[proto]), key=lambda v: int(v.split("-")[0]))
        clauses.append(f"meta l4proto {_PROTO[proto]} th dport {{ {', '.join(values)} }}")
    return clauses or None


class _Builder:
    def __init__(self) -> None:
        self.sets: list[NftSet] = []

    def add_set(self, name: str, type_: str, elements: Iterable[str], interval: bool) -> str:
        self.sets.append(NftSet(name, type_, interval, frozenset(elements)))
        return name

    def rules(
        self,
        chain: str,
        n: int,
        ingress: bool,
        match: _Match,
        ports: Sequence[PortSpec],
        pod: PodOnNetwork,
        verdict: str,
        comment: str,
    ) -> list[str]:
        """The rules of one policy rule: one per address set and port clause."""
        tail = f"counter {verdict} comment {_quote(comment)}"
        # ingress: named ports are this pod's; egress: the peer's (a set of address.port)
        numbered = [p for p in ports if ingress or not isinstance(p.port, str)]
        named = [p for p in ports if not ingress and isinstance(p.port, str)]
        clauses = (
            _port_clauses(numbered, pod if ingress else None) if numbered or not named else None
        )
        out: list[str] = []
        direction = "saddr" if ingress else "daddr"
        if match.everyone:
            for clause in clauses or []:
                out.append(_join(clause, tail))
            if named:
                out.extend(self._named(chain, n, match, named, tail))
            return out
        for version, family, addr_type in ((4, "ip", "ipv4_addr"), (6, "ip6", "ipv6_addr")):
            if match.has_selectors and clauses is not None:
                ips = sorted({ip for p in match.pods for ip in p.ips(version)})
                name = self.add_set(f"{chain}_{n}_p{version}", addr_type, ips, interval=False)
                out.extend(_join(f"{family} {direction} @{name}", c, tail) for c in clauses)
            blocks = _collapsed(match.cidrs, version)
            if blocks and clauses is not None:
                name = self.add_set(f"{chain}_{n}_b{version}", addr_type, blocks, interval=True)
                out.extend(_join(f"{family} {direction} @{name}", c, tail) for c in clauses)
        if named and match.has_selectors:
            out.extend(self._named(chain, n, match, named, tail))
        return out

    def _named(
        self,
        chain: str,
        n: int,
        match: _Match,
        named: Sequence[PortSpec],
        tail: str,
    ) -> list[str]:
        """Egress to a named port: the port is each peer pod's own, so address, protocol and
        port go into one concatenated set. With every peer allowed, every pod on the network
        that has such a port is the peer set (ipBlock peers have no named ports)."""
        pods = match.pods
        out = []
        for version, family, addr_type in ((4, "ip", "ipv4_addr"), (6, "ip6", "ipv6_addr")):
            elements = {
                f"{ip} . {_PROTO[proto]} . {port}"
                for pod in pods
                for spec in named
                for proto, port in pod.resolve(spec)
                for ip in pod.ips(version)
            }
            name = self.add_set(
                f"{chain}_{n}_n{version}",
                f"{addr_type} . inet_proto . inet_service",
                elements,
                interval=False,
            )
            out.append(_join(f"{family} daddr . meta l4proto . th dport @{name}", tail))
        return out


def _join(*parts: str) -> str:
    return " ".join(p for p in parts if p)


_COMMENT_SAFE = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ._-/:()[],=@+"
)


def _quote(text: str) -> str:
    """A quoted nft string of at most 120 bytes (nft's comments hold 128). What a user wrote
    (an admin rule's name) reaches the script only through here: every character but a few
    safe ASCII ones becomes '_', so no quote, backslash or line break ends the string or the
    command."""
    return '"' + "".join(c if c in _COMMENT_SAFE else "_" for c in text[:120]) + '"'


def _admin_verdict(action: Action) -> str:
    return {Action.ALLOW: "accept", Action.DENY: "drop", Action.PASS: "return"}[action]


def _direction(
    builder: _Builder,
    prefix: str,
    ingress: bool,
    pod: PodOnNetwork,
    view: NetworkView,
    tenant: Sequence[MultiNetworkPolicy],
    admin: Sequence[AdminNetworkPolicy],
) -> list[Chain]:
    word = "ingress" if ingress else "egress"
    policy_type = "Ingress" if ingress else "Egress"
    top = f"{prefix}_{'in' if ingress else 'out'}"
    chains: list[Chain] = []
    rules = ["ct state established,related accept", *(ALWAYS_IN if ingress else ALWAYS_OUT)]
    admin_rules: list[str] = []
    n = 0
    ns_labels = view.labels_of(pod.namespace)
    for admin_policy in admin:  # those for this network, in order
        if not admin_policy.selects(ns_labels, pod.labels):
            continue
        arules: Sequence[AdminRule] = admin_policy.ingress if ingress else admin_policy.egress
        for i, arule in enumerate(arules):
            match = _admin_match(arule.peers, view)
            label = f"{admin_policy.ref} {word}[{i}]" + (f" {arule.name}" if arule.name else "")
            admin_rules += builder.rules(
                f"{top}_a",
                n,
                ingress,
                match,
                arule.ports,
                pod,
                _admin_verdict(arule.action),
                label,
            )
            n += 1
    if admin_rules:
        chains.append(Chain(f"{top}_admin", tuple(admin_rules)))
        rules.append(f"jump {top}_admin")
    selecting = [
        p
        for p in tenant  # those for this network that select the pod
        if policy_type in p.policy_types
    ]
    if selecting:
        tenant_rules: list[str] = []
        n = 0
        for policy in sorted(selecting, key=lambda p: p.ref):
            for i, rule in enumerate(policy.ingress if ingress else policy.egress):
                match = _tenant_match(rule, policy, view)
                tenant_rules += builder.rules(
                    f"{top}_t",
                    n,
                    ingress,
                    match,
                    rule.ports,
                    pod,
                    "accept",
                    f"{policy.ref} {word}[{i}]",
                )
                n += 1
        chains.append(Chain(f"{top}_tenant", tuple(tenant_rules)))
        rules.append(f"jump {top}_tenant")
        refs = ",".join(p.ref for p in sorted(selecting, key=lambda p: p.ref))
        rules.append(f"counter drop comment {_quote(f'default-deny {word} ({refs})')}")
    else:
        rules.append(f"counter accept comment {_quote(f'no policy isolates {word}')}")
    return [Chain(top, tuple(rules)), *chains]


def compile_pod(
    pod: PodOnNetwork,
    interfaces: Sequence[PodInterface],
    tenant: Iterable[MultiNetworkPolicy],
    admin: Iterable[AdminNetworkPolicy] = (),
    table: str = TABLE,
) -> Ruleset:
    """The pod's table: each interface's ingress and egress, admin tier first. `pod` is the pod
    as it is on the networks (its labels and named ports); each interface's view lists the
    pods of its network with their addresses there (the pod itself among them)."""
    tenant = list(tenant)
    admin = ordered_admin(admin)
    builder = _Builder()
    dispatch_in: list[str] = []
    dispatch_out: list[str] = []
    chains: list[Chain] = []
    isolating = False
    for index, iface in enumerate(interfaces):
        prefix = f"if{index}"
        _check_ifname(iface.ifname)
        name = _quote(iface.ifname)
        dispatch_in.append(f"iifname {name} jump {prefix}_in")
        dispatch_out.append(f"oifname {name} jump {prefix}_out")
        key = iface.network.key
        mine = [
            p
            for p in tenant
            if p.selects(pod.namespace, pod.labels) and any(t.key == key for t in p.targets)
        ]
        theirs = [p for p in admin if any(t.key == key for t in p.targets)]
        isolating = isolating or bool(mine or theirs)
        for ingress in (True, False):
            chains += _direction(builder, prefix, ingress, pod, iface.network, mine, theirs)
    base = [
        Chain("input", tuple(dispatch_in), "input"),
        Chain("output", tuple(dispatch_out), "output"),
    ]
    return Ruleset(tuple(base + chains), tuple(builder.sets), table, isolating)


# ---------------------------------------------------------------- where it can be enforced

HOST_SIDE = (
    "enforced on the host's side of the pod's veth (the ptp plugin routes the pod's traffic "
    "through it), where the pod cannot undo it"
)
BRIDGE_HOST_SIDE = (
    "enforced on the host for the pod's addresses, where the pod cannot undo it: its bridge "
    "hands its frames to the host's inet hooks (nf_call_iptables), and its port lets through "
    "only the pod's own MAC and addresses"
)
POD_SIDE_CAVEAT = (
    "enforced in the pod's network namespace: holds only while the pod lacks CAP_NET_ADMIN "
    "(a pod with it can delete the table)"
)
# plugin type -> why its interfaces cannot be enforced at all
REFUSED: Mapping[str, str] = {
    "dpdk": "the interface is a userspace (DPDK) device: no kernel path, no netfilter hook",
    "vhostuser": "a vhost-user socket, not a kernel interface: no netfilter hook",
    "userspace": "a userspace datapath (OVS-DPDK, VPP): no kernel path, no netfilter hook",
    "ib-sriov": "an InfiniBand VF: RDMA traffic bypasses the kernel's IP stack",
}
# plugin types whose interface is a kernel netdev in the pod's namespace (every one cnidra runs
# today: the main plugins of the bundled set)
POD_NETDEV = frozenset(
    {"macvlan", "ipvlan", "vlan", "host-device", "bridge", "ptp", "sriov", "tap", "dummy"}
)
# plugin types whose pod interface is a veth the host routes (ptp): enforced on the host's end
HOST_VETH = frozenset({"ptp"})
# plugin types whose pod interface is a veth on a bridge: enforced on the host by the pod's
# addresses, through the bridge's own nf_call_iptables (br_netfilter: stateful in the `inet`
# family, which sees the bridge, not the port), with an anti-spoofing `bridge` table on the port
HOST_BRIDGE = frozenset({"bridge"})


def host_interface(plugin_type: str, result: Mapping[str, Any] | None) -> str | None:
    """The host's end of a pod's veth as the plugin's CNI result lists it (an interface with no
    sandbox): for a plugin enforced there (HOST_VETH), when the result names exactly one."""
    if plugin_type not in HOST_VETH or not result:
        return None
    found = [
        str(i["name"])
        for i in result.get("interfaces") or []
        if isinstance(i, Mapping) and i.get("name") and not i.get("sandbox")
    ]
    return found[0] if len(found) == 1 else None


@dataclass(frozen=True)
class Enforcement:
    """Where an interface's policy is enforced, or why it cannot be (`refused`)."""

    where: str | None  # "pod": the pod's namespace; "host": the host's veth; None: refused
    caveat: str = ""
    refused: str = ""


def enforcement(
    plugin_type: str, *, kernel_netdev: bool = True, bridge_on_host: bool = False
) -> Enforcement:
    """Where policy for an interface of `plugin_type` is enforced. `kernel_netdev` False: the
    device the pod got is no kernel interface (an SR-IOV VF bound to vfio-pci for DPDK).
    `bridge_on_host` False (the driver's --no-bridge-policy-on-host): a bridge's interfaces in
    the pod's namespace, the bridge's traffic left out of the node's inet hooks."""
    if plugin_type in REFUSED:
        return Enforcement(None, refused=REFUSED[plugin_type])
    if not kernel_netdev:
        return Enforcement(
            None,
            refused=f"the {plugin_type} device is bound to a userspace driver (vfio-pci, "
            "DPDK): no kernel interface carries its traffic",
        )
    if plugin_type in HOST_VETH:
        return Enforcement("host", caveat=HOST_SIDE)
    if plugin_type in HOST_BRIDGE and bridge_on_host:
        return Enforcement("host", caveat=BRIDGE_HOST_SIDE)
    if plugin_type in POD_NETDEV:
        return Enforcement("pod", caveat=POD_SIDE_CAVEAT)
    return Enforcement(
        None, refused=f"plugin type {plugin_type!r} is not known to give a kernel interface"
    )


def undoes_pod_side(pod_spec: Mapping[str, Any]) -> list[str]:
    """The containers of a pod (its spec) that could delete a policy table enforced in the
    pod's namespace: privileged, or given CAP_NET_ADMIN (or ALL), in containers, init
    containers or ephemeral containers. A pod sharing the host's network namespace has no
    secondary interfaces of cnidra's and is not asked about. For `describe` and a condition."""
    found = []
    for field_name in ("initContainers", "containers", "ephemeralContainers"):
        for container in pod_spec.get(field_name) or []:
            if not isinstance(container, Mapping):
                continue
            context = container.get("securityContext") or {}
            if not isinstance(context, Mapping):
                continue
            caps = context.get("capabilities") or {}
            added = caps.get("add") or [] if isinstance(caps, Mapping) else []
            names = {str(c).upper().removeprefix("CAP_") for c in added}
            if context.get("privileged") is True or names & {"NET_ADMIN", "ALL"}:
                found.append(str(container.get("name", "?")))
    return found
