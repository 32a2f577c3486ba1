"""What a claim may ask of the root driver: the admin's CNIPolicy and the rules no policy lifts.
Pure: no I/O. docs/security.md has the threat model.

DRA tags every config it hands the driver: `FromClass` came from a DeviceClass (only an admin
writes those), `FromClaim` from the claim (any tenant who may create claims in a namespace).
So:

- **The class decides, the claim chooses within it.** A claim may set `ifName` and nothing
  else, unless the class carries a `CNIPolicy` that opens more (its own network `config`
  within listed plugin types, IP ranges and VLAN IDs; `args`; named capabilities), optionally
  only for some namespaces.
- **Class values are locked.** Whatever a FromClass config sets, a claim can neither change
  nor remove (`null`); not even a policy lifts that.
- **Dangerous by nature is never the claim's**: paths the root driver would write or connect
  to, host-side addressing, routing and NAT, raw runtimeConfig, port mappings, firewall
  chains, prevResult, the CNI_ARGS the driver sets, `ifName: lo`. A class may set them.
- **The config is bound to the allocation**: the link the scheduler allocated is the one
  configured (`bind_to_device`).
"""

from __future__ import annotations

import bisect
import ipaddress
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from cnidra.api.bandwidth import DEFAULT_RULES, BandwidthRules
from cnidra.api.claimspec import configs_for, read_configs
from cnidra.api.constants import API_VERSION, DRIVER_NAME
from cnidra.api.issues import ROOT, FieldPath, Issues, listing
from cnidra.api.merge import ConfigEntry, Source
from cnidra.api.tenant import Path, TenantNetwork, address_outside, decode_network, is_zero

POLICY_KIND = "CNIPolicy"

# Plugin fields no claim may set, whatever the policy: (plugin type, field) or ("*", field).
# Each names what it would let a tenant do to the node as root.
DANGEROUS: Mapping[tuple[str, str], str] = {
    ("*", "runtimeConfig"): "raw runtimeConfig goes to the plugin as the runtime's own input",
    ("*", "prevResult"): "prevResult is the runtime's to pass",
    ("bridge", "forceAddress"): "replaces the host bridge's address",
    ("bridge", "isGateway"): "adds addresses and routes on the host",
    ("bridge", "isDefaultGateway"): "adds addresses and routes on the host",
    ("bridge", "ipMasq"): "adds NAT rules on the host",
    ("bridge", "ipMasqBackend"): "chooses how NAT is added on the host",
    ("bridge", "promiscMode"): "puts the host bridge in promiscuous mode",
    ("bridge", "macspoofchk"): "adds nftables rules on the host",
    ("ptp", "ipMasq"): "adds NAT rules on the host",
    ("ptp", "ipMasqBackend"): "chooses how NAT is added on the host",
    ("*", "cni.dev/valid-attachments"): "the runtime's list for garbage collection",
    ("host-device", "kernelpath"): "a host path the root driver reads",
    ("host-device", "pciBusID"): "moves any PCI device of the node",
    ("host-device", "hwaddr"): "picks a host link by its address, not the allocated one",
    ("host-device", "deviceID"): "picks a host device other than the allocated link",
    ("tuning", "dataDir"): "a host path the root driver writes",
    # the plugin then looks the parent up in the pod's namespace: the child sits on whichever
    # pod interface bears the allocated link's name (another network's, or eth0), not on it
    ("macvlan", "linkInContainer"): "puts the child on a pod interface, not the allocated link",
    ("ipvlan", "linkInContainer"): "puts the child on a pod interface, not the allocated link",
    ("vlan", "linkInContainer"): "puts the child on a pod interface, not the allocated link",
    # a macvlan, ipvlan or vlan child passes these flags to its parent: the host link
    ("tuning", "promisc"): "a promiscuous macvlan or vlan makes its host parent promiscuous",
    ("tuning", "allmulti"): "an all-multicast macvlan or vlan makes its host parent so too",
    ("tap", "selinuxContext"): "a host security label",
    ("portmap", "externalSetMarkChain"): "host iptables chains",
    ("portmap", "masqAll"): "adds NAT rules on the host",
    ("portmap", "snat"): "adds NAT rules on the host",
    ("portmap", "conditionsV4"): "host iptables rules",
    ("portmap", "conditionsV6"): "host iptables rules",
    ("firewall", "iptablesAdminChainName"): "host iptables chains",
    ("firewall", "firewalldZone"): "host firewall zones",
    ("firewall", "backend"): "the host firewall",
}
DANGEROUS_IPAM: Mapping[tuple[str, str], str] = {
    ("host-local", "dataDir"): "a host path the root driver writes",
    ("host-local", "resolvConf"): "a host file the root driver reads into the result",
    ("dhcp", "daemonSocketPath"): "a host socket the root driver connects to",
}
# IPAM a tenant may not write on a shared link: it hands out addresses without knowing who
# else holds them on the segment (docs/security.md, "Addresses are owned")
SEGMENT_BLIND_IPAM: Mapping[str, str] = {
    "host-local": (
        "host-local written by a claim is refused: it keeps one pool per network name and "
        "node, so two namespaces, or two nodes on one L2 segment, hand out the same addresses"
    ),
}
# macvlan's passthru gives the pod the parent link itself: every other pod on it loses it
EXCLUSIVE_MODES: Mapping[tuple[str, str], str] = {("macvlan", "passthru"): "macvlan passthru"}
# Settings that act on the parent link or the segment every pod on it shares, a claim's only
# with the class's claims.segmentSettings: (plugin type, field) -> (the values that change
# nothing, what the others do)
SEGMENT_SETTINGS: Mapping[tuple[str, str], tuple[tuple[Any, ...], str]] = {
    ("ipvlan", "mode"): (
        (None, "", "l2"),
        "the ipvlan mode is the parent's, shared by every ipvlan on it: each ADD sets it for "
        "all of them (l3 and l3s also route the pod by the node's tables and netfilter)",
    ),
    ("macvlan", "bcqueuelen"): (
        (None, 0),
        "the broadcast queue is the parent's, shared by every macvlan on it (the largest asked "
        "for wins)",
    ),
    ("bridge", "mac"): (
        (None, ""),
        "a chosen MAC moves that address to the pod's port in the bridge (another station's "
        "traffic with it)",
    ),
    ("macvlan", "mac"): (
        (None, ""),
        "a chosen MAC enters the parent's address filter and is answered from the pod",
    ),
    ("tuning", "mac"): (
        (None, ""),
        "a chosen MAC is used on the segment by the pod (another station's traffic with it)",
    ),
}
# tuning sysctls no claim may set: the one net key a namespace shares with the node (kernel
# 6.18: it cannot even be turned off again), and those that make the pod answer for addresses
# that are not its own on the segment (proxy ARP / NDP)
NODE_WIDE_SYSCTLS = ("net.netfilter.nf_hooks_lwtunnel",)
PROXY_SYSCTLS = ("proxy_arp", "proxy_arp_pvlan", "proxy_ndp")
# CNIConfig.capabilities no claim may ask for: portMappings DNATs node ports.
DANGEROUS_CAPABILITIES = {"portMappings": "DNATs node ports to the pod, past the hostPort rules"}
# CNI_ARGS the driver sets for the pod; a claim's would come after and win.
DRIVER_ARGS_PREFIX = "K8S_POD_"
DRIVER_ARGS = {"IgnoreUnknown"}
# The parent link each plugin names; the driver fills it from the allocated device.
PARENT_FIELDS: Mapping[str, str] = {
    "macvlan": "master",
    "ipvlan": "master",
    "vlan": "master",
    "host-device": "device",
    "bridge": "bridge",
}
CNICONFIG_KEYS = ("apiVersion", "kind")
MAX_VLAN_SPAN_END = 1 << 62  # above any span's end: bisect finds the last span starting <= low


class LabelRequirement(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str
    operator: str
    values: list[str] = []


class LabelSelector(BaseModel):
    model_config = ConfigDict(extra="forbid")
    match_labels: dict[str, str] = Field(default_factory=dict, alias="matchLabels")
    match_expressions: list[LabelRequirement] = Field(
        default_factory=list, alias="matchExpressions"
    )

    def matches(self, labels: Mapping[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        for req in self.match_expressions:
            value = labels.get(req.key)
            ok = {
                "In": value in req.values,
                "NotIn": value not in req.values,
                "Exists": value is not None,
                "DoesNotExist": value is None,
            }.get(req.operator, False)
            if not ok:
                return False
        return True


class ClaimRules(BaseModel):
    """What claims using the class may set besides ifName."""

    model_config = ConfigDict(extra="forbid")
    define_networks: bool = Field(False, alias="defineNetworks")
    plugins: list[str] = Field(default_factory=list)
    fields: list[str] = Field(default_factory=list)
    ip_ranges: list[ipaddress.IPv4Network | ipaddress.IPv6Network] | None = Field(
        None, alias="ipRanges"
    )
    vlan_ids: list[str] | None = Field(None, alias="vlanIDs")
    # fields of a plugin (or IPAM plugin) type beyond those cnidra knows, opened by name
    plugin_fields: dict[str, list[str]] = Field(default_factory=dict, alias="pluginFields")
    # modes that take the parent link for one pod (macvlan passthru)
    exclusive_link_modes: bool = Field(False, alias="exclusiveLinkModes")
    # settings of the parent link or the segment that every pod on it shares (SEGMENT_SETTINGS)
    segment_settings: bool = Field(False, alias="segmentSettings")
    # namespaces besides the claim's own whose NetworkAttachmentDefinitions claims may use
    # (Multus' namespaceIsolation with its global namespaces)
    attachment_definition_namespaces: list[str] = Field(
        default_factory=list, alias="attachmentDefinitionNamespaces"
    )
    _merged: list[tuple[int, int]] | None = PrivateAttr(default=None)

    def _spans(self) -> list[tuple[int, int]]:
        """The allowed VLAN IDs as sorted, disjoint spans (adjacent ones joined), parsed once:
        a judgement asks for every VLAN a network names."""
        if self._merged is None:
            spans = []
            for item in self.vlan_ids or []:
                low, _, high = item.partition("-")
                if low.isdigit() and (not high or high.isdigit()):
                    spans.append((int(low), int(high or low)))
            merged: list[tuple[int, int]] = []
            for lo, hi in sorted(spans):
                if merged and lo <= merged[-1][1] + 1:
                    merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
                else:
                    merged.append((lo, hi))
            self._merged = merged
        return self._merged

    def vlan_allowed(self, vlan: int) -> bool:
        return self.vlan_ids is None or self.span_allowed(vlan, vlan)

    def span_allowed(self, low: int, high: int) -> bool:
        """Every VLAN of low..high is allowed (a trunk carries them all): one span holds them."""
        if self.vlan_ids is None:
            return True
        spans = self._spans()
        i = bisect.bisect_right(spans, (low, MAX_VLAN_SPAN_END)) - 1
        return i >= 0 and spans[i][0] <= low and high <= spans[i][1]


# without a policy (or outside its namespaces) a claim may set ifName and nothing else
NO_RULES = ClaimRules.model_validate({})


class CNIPolicy(BaseModel):
    """Carried in a DeviceClass's config (an opaque config of the driver, kind CNIPolicy)."""

    model_config = ConfigDict(extra="forbid")
    api_version: str = Field(API_VERSION, alias="apiVersion")
    kind: str = POLICY_KIND
    claims: ClaimRules = Field(default_factory=lambda: NO_RULES)
    namespaces: list[str] | None = None
    namespace_selector: LabelSelector | None = Field(None, alias="namespaceSelector")
    node_links: list[str] = Field(default_factory=list, alias="nodeLinks")
    # the rate limit every claim of the class is held to (cnidra.api.bandwidth), whatever
    # namespaces the claim rules cover; None: the defaults (whenUnreserved Unlimited, no bursts)
    bandwidth: BandwidthRules | None = None

    def applies_to(self, namespace: str, labels: Mapping[str, str] | None) -> bool | None:
        """Whether the claim rules cover this namespace; None: its labels are not known."""
        if self.namespaces is not None and namespace not in self.namespaces:
            return False
        if self.namespace_selector is None:
            return True
        if labels is None:
            return None
        return self.namespace_selector.matches(labels)


def is_policy(parameters: Any) -> bool:
    return isinstance(parameters, Mapping) and parameters.get("kind") == POLICY_KIND


CLASS_CONFIG = ROOT / "spec" / "config"  # where a DeviceClass's config entries are


def class_bandwidth(device_class: Mapping[str, Any], issues: Issues) -> BandwidthRules | None:
    """The `bandwidth` rules a DeviceClass (as the apiserver serves it) gives its claims: its
    CNIPolicy's, the defaults when it carries none; None (the reasons in `issues`) when its
    CNIPolicy is invalid or it carries more than one."""
    spec = device_class.get("spec") if isinstance(device_class, Mapping) else None
    configs = spec.get("config") if isinstance(spec, Mapping) else None
    found: list[tuple[FieldPath, Mapping[str, Any]]] = [
        (entry.parameters_path, entry.parameters)
        for entry in configs_for(DRIVER_NAME, read_configs(configs, CLASS_CONFIG, Issues()))
        if isinstance(entry.parameters, Mapping) and is_policy(entry.parameters)
    ]
    if not found:
        return DEFAULT_RULES
    if len(found) > 1:
        issues.error(found[1][0] / "kind", "a DeviceClass may carry one CNIPolicy")
        return None
    path, parameters = found[0]
    policy = parse_policy(parameters, path, issues)
    if policy is None:
        return None
    return policy.bandwidth or DEFAULT_RULES


def parse_policy(
    parameters: Mapping[str, Any], path: FieldPath, issues: Issues
) -> CNIPolicy | None:
    try:
        policy = CNIPolicy.model_validate(dict(parameters))
    except ValidationError as exc:
        for err in exc.errors():
            loc = path
            for part in err["loc"]:
                loc = loc / part
            issues.error(loc, str(err["msg"]).removeprefix("Value error, "))
        return None
    if policy.api_version != API_VERSION:
        issues.error(path / "apiVersion", f"must be {API_VERSION}")
        return None
    for i, item in enumerate(policy.claims.vlan_ids or []):
        low, _, high = item.partition("-")
        if not (low.isdigit() and (not high or high.isdigit())):
            issues.error(path / "claims" / "vlanIDs" / i, f"{item!r} must be an ID or LOW-HIGH")
    return policy


@dataclass(frozen=True)
class Verdict:
    """The policy that governs a request, and whether its claim rules cover the namespace."""

    policy: CNIPolicy | None
    covered: bool
    reason: str = ""


def governing_policy(
    class_entries: Sequence[ConfigEntry],
    namespace: str,
    labels: Mapping[str, str] | None,
    issues: Issues,
) -> Verdict:
    policies = [e for e in class_entries if is_policy(e.parameters)]
    if not policies:
        return Verdict(None, False, "the DeviceClass has no CNIPolicy")
    if len(policies) > 1:
        for extra in policies[1:]:
            issues.error(extra.path / "kind", "a DeviceClass may carry one CNIPolicy")
    policy = parse_policy(policies[0].parameters, policies[0].path, issues)
    if policy is None:
        return Verdict(None, False, "the DeviceClass's CNIPolicy is invalid")
    covered = policy.applies_to(namespace, labels)
    if covered is None:
        return Verdict(policy, False, f"the labels of namespace {namespace} could not be read")
    if not covered:
        return Verdict(policy, False, f"the class's CNIPolicy does not cover namespace {namespace}")
    return Verdict(policy, True)


def leaves(value: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Paths a merge patch writes: objects recurse, anything else (lists, scalars, null)
    replaces what is there."""
    if isinstance(value, Mapping) and value:
        for key, item in value.items():
            yield from leaves(item, (*path, key))
    else:
        yield path, value


class _Locked:
    """The paths a DeviceClass's configs write, as a tree of their folded keys: whether a
    claim's path is one of them, lies inside one or holds one is one walk down the claim's
    path, however many paths the class writes. Keys are compared case-insensitively, because
    the plugins read `MTU` as `mtu` (a claim must not override a class field by its spelling)."""

    __slots__ = ("below", "below_order", "children", "here", "here_order")

    def __init__(self) -> None:
        self.children: dict[Any, _Locked] = {}
        self.here: FieldPath | None = None  # the first class config whose path ends here
        self.here_order = 0
        self.below: FieldPath | None = None  # the first class config whose path passes here
        self.below_order = 0

    def add(self, path: tuple[Any, ...], order: int, where: FieldPath) -> None:
        """One path; configs are added in DRA order: the first to write a path is named."""
        node = self
        node._passes(order, where)
        for key in _folded(path):
            node = node.children.setdefault(key, _Locked())
            node._passes(order, where)
        if node.here is None:
            node.here, node.here_order = where, order

    def write(self, value: Any, order: int, where: FieldPath) -> int:
        """Every path `value` writes (`leaves`' paths, numbered from `order` in their order),
        in one walk of it; returns the next number."""
        self._passes(order, where)
        if isinstance(value, Mapping) and value:
            for key, item in value.items():
                folded = key.lower() if isinstance(key, str) else key
                child = self.children.get(folded)
                if child is None:
                    child = self.children[folded] = _Locked()
                order = child.write(item, order, where)
            return order
        if self.here is None:
            self.here, self.here_order = where, order
        return order + 1

    def _passes(self, order: int, where: FieldPath) -> None:
        if self.below is None:
            self.below, self.below_order = where, order

    def clash(self, path: tuple[Any, ...]) -> FieldPath | None:
        """The class config, first in DRA order, that writes `path`, a path holding it or a
        path inside it; None when none does."""
        found: tuple[int, FieldPath] | None = None
        node = self
        for key in path:
            if node.here is not None and (found is None or node.here_order < found[0]):
                found = (node.here_order, node.here)
            child = node.children.get(key.lower() if isinstance(key, str) else key)
            if child is None:
                return found[1] if found else None
            node = child
        if node.below is not None and (found is None or node.below_order < found[0]):
            found = (node.below_order, node.below)
        return found[1] if found else None


def _folded(path: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(p.lower() if isinstance(p, str) else p for p in path)


def check_claim(
    entries: Sequence[ConfigEntry],
    merged: Mapping[str, Any],
    namespace: str,
    labels: Mapping[str, str] | None,
    issues: Issues,
) -> None:
    """Errors for everything the claim's configs (FromClaim) ask that its class does not allow.
    `entries` apply to one request, in DRA order; `merged` is their merge."""
    class_entries = [e for e in entries if e.source is Source.CLASS]
    claim_entries = [e for e in entries if e.source is Source.CLAIM]
    for entry in claim_entries:
        if is_policy(entry.parameters):
            issues.error(entry.path / "kind", "a CNIPolicy comes from a DeviceClass, not a claim")
    claim_entries = [e for e in claim_entries if not is_policy(e.parameters)]
    if not claim_entries:
        return
    verdict = governing_policy(class_entries, namespace, labels, issues)
    rules = verdict.policy.claims if verdict.covered and verdict.policy else NO_RULES
    why = f" ({verdict.reason})" if verdict.reason else ""
    locked = _Locked()  # what the class's configs write, each path numbered in DRA order
    order = 0
    for e in class_entries:
        if not is_policy(e.parameters):
            written = {k: v for k, v in e.parameters.items() if k not in CNICONFIG_KEYS}
            order = locked.write(written, order, e.path)
    for entry in claim_entries:
        params = {k: v for k, v in entry.parameters.items() if k not in CNICONFIG_KEYS}
        if not params:  # e.g. only a network reference, which has been put in place
            continue
        defines = False
        for path, value in leaves(params):
            where = entry.path.join(path)
            clash = locked.clash(path)
            if clash is not None:
                issues.error(
                    where,
                    f"is set by the DeviceClass ({clash}); a claim may not change or remove it",
                )
            elif path[:1] == ("config",):
                defines = True
            else:
                _check_field(path, value, where, rules, why, issues)
        if defines and not rules.define_networks:
            issues.error(
                entry.path / "config",
                "a claim may not define its network with this DeviceClass: the network comes "
                f"from the class{why}; ask the admin for a class whose CNIPolicy allows "
                "defineNetworks",
            )
    if any("config" in e.parameters for e in claim_entries) and rules.define_networks:
        network = _check_network(merged.get("config"), claim_entries, class_entries, rules, issues)
        if network is not None:
            _check_static_sources(network, claim_entries, issues)


STATIC_SOURCES = (
    "would replace the static addresses the network writes in ipam.addresses (the static "
    "plugin reads it over its own); a tenant's static addresses come from ipam.addresses only, "
    "so that prepare leases exactly those (docs/ipam.md)"
)


def _check_static_sources(
    network: TenantNetwork, claim_entries: Sequence[ConfigEntry], issues: Issues
) -> None:
    """A tenant's static IPAM is leased through the cluster IPAM from its ipam.addresses; the
    other places the static plugin reads addresses from would go around that."""
    static = [
        p
        for p in network.plugins
        if p.ipam is not None
        and p.ipam.type == "static"
        and not (
            network.is_admin((*p.raw, "ipam", "type"))
            and network.is_admin((*p.raw, "ipam", "addresses"))
        )
    ]
    if not static:
        return
    for plugin in static:
        args = plugin.get("args")
        cni = args.get("cni") if isinstance(args, Mapping) else None
        if isinstance(cni, Mapping) and "ips" in cni:
            issues.error(plugin.path / "args" / "cni" / "ips", STATIC_SOURCES)
    for entry in claim_entries:
        args = entry.parameters.get("args")
        for key in ADDRESS_ARGS:
            if isinstance(args, Mapping) and key in args:
                issues.error(entry.path / "args" / key, STATIC_SOURCES)
        caps = entry.parameters.get("capabilities")
        if isinstance(caps, Mapping) and "ips" in caps:
            issues.error(entry.path / "capabilities" / "ips", STATIC_SOURCES)


def _check_field(
    path: Path,
    value: Any,
    where: FieldPath,
    rules: ClaimRules,
    why: str,
    issues: Issues,
) -> None:
    head = path[0] if path else ""
    if head == "attach":  # when, not what: the same network either way
        return
    if head == "ifNamePrefix":
        return
    if head == "ifName":
        if value == "lo":
            issues.error(where, "'lo' is the pod's loopback; a claim may not configure it")
        return
    if head == "args" and len(path) > 1:
        key = str(path[1])
        if key.startswith(DRIVER_ARGS_PREFIX) or key in DRIVER_ARGS:
            issues.error(where, f"{key} is a CNI_ARG the driver sets for the pod")
            return
    if head == "capabilities" and len(path) > 1 and str(path[1]) in DANGEROUS_CAPABILITIES:
        issues.error(where, f"never claim-settable: {DANGEROUS_CAPABILITIES[str(path[1])]}")
        return
    name = ".".join(str(p) for p in path[:2])
    if head in ("args", "capabilities", "ipamClaimReference") and (
        head in rules.fields or name in rules.fields
    ):
        for text in _requested_addresses(path, value):
            _check_address(text, where, rules, issues)
        return
    issues.error(
        where,
        f"a claim may not set this with this DeviceClass{why}; its CNIPolicy must list "
        f"{name!r} in claims.fields",
    )


def admin_paths(class_entries: Sequence[ConfigEntry]) -> frozenset[Path]:
    """Where in the network (`config`, as paths below it) the DeviceClass's configs wrote: a
    claim cannot change those (check_claim), so what lies there is the admin's."""
    return frozenset(
        p[1:]
        for e in class_entries
        if not is_policy(e.parameters)
        for p, _ in leaves({"config": e.parameters.get("config")})
        if p[:1] == ("config",) and e.parameters.get("config") is not None
    )


def _check_network(
    config: Any,
    claim_entries: Sequence[ConfigEntry],
    class_entries: Sequence[ConfigEntry],
    rules: ClaimRules,
    issues: Issues,
) -> TenantNetwork | None:
    """The claim's own network (None: not an object, which the validator names), decoded into
    the form the plugins read (`cnidra.api.tenant`) and judged in that form: plugin types,
    never-settable fields, link modes, IP ranges and VLAN IDs from every field a plugin reads
    them from."""
    if not isinstance(config, Mapping):
        return None  # the validator names what it must be
    anchor = next(e.path / "config" for e in reversed(claim_entries) if "config" in e.parameters)
    admin = admin_paths(class_entries)
    network = decode_network(config, anchor, issues, admin=admin, opened=rules.plugin_fields)
    for plugin in network.plugins:
        if not network.is_admin((*plugin.raw, "type")):
            _check_type("plugin", plugin.type, plugin.path, rules, issues)
        blind = plugin.ipam is not None and plugin.ipam.type in SEGMENT_BLIND_IPAM
        # a segment-blind IPAM is refused below whatever the class lists, with the reason
        tenant_type = not network.is_admin((*plugin.raw, "ipam", "type"))
        if plugin.ipam is not None and tenant_type and not blind:
            _check_type("IPAM plugin", plugin.ipam.type, plugin.ipam.path, rules, issues)
        if plugin.ipam is not None and blind:
            wrote = [
                k
                for k in (*plugin.ipam.fields, "type")
                if not network.is_admin((*plugin.raw, "ipam", k))
            ]
            if wrote:
                issues.error(
                    plugin.ipam.path / ("type" if "type" in wrote else wrote[0]),
                    f"{SEGMENT_BLIND_IPAM[plugin.ipam.type]}; a claim's network takes its "
                    "addresses from an owner that knows the segment: `ipam: {type: cnidra, "
                    "pool: NAME}` (a CNIIPPool serving this namespace) or static addresses "
                    "inside one (docs/ipam.md)",
                )
    for plugin, key, where in network.tenant_fields():
        reason = DANGEROUS.get((plugin.type, key)) or DANGEROUS.get(("*", key))
        if reason and not is_zero(plugin.get(key)):
            issues.error(where, f"never claim-settable: {reason}")
        mode = EXCLUSIVE_MODES.get((plugin.type, str(plugin.get(key)))) if key == "mode" else None
        if mode and not rules.exclusive_link_modes:
            issues.error(
                where,
                f"{mode} takes the parent link for one pod, so every other pod on it loses it; "
                "the DeviceClass's CNIPolicy must set claims.exclusiveLinkModes",
            )
        shared = SEGMENT_SETTINGS.get((plugin.type, key))
        if shared and plugin.get(key) not in shared[0] and not rules.segment_settings:
            issues.error(
                where,
                f"{shared[1]}; the DeviceClass's CNIPolicy must set claims.segmentSettings",
            )
        if plugin.type == "tuning" and key == "sysctl":
            _check_sysctls(plugin.get(key), where, issues)
    for plugin, where, key, value in network.tenant_args():
        reason = DANGEROUS.get((plugin.type, key))
        if reason and not is_zero(value):
            issues.error(where, f"never claim-settable: {reason}")
        shared = SEGMENT_SETTINGS.get((plugin.type, key))
        if shared and value not in shared[0] and not rules.segment_settings:
            issues.error(
                where,
                f"{shared[1]}; the DeviceClass's CNIPolicy must set claims.segmentSettings",
            )
        if plugin.type == "tuning" and key == "sysctl":
            _check_sysctls(value, where, issues)
    for plugin, key, where in network.tenant_ipam_fields():
        assert plugin.ipam is not None
        reason = DANGEROUS_IPAM.get((plugin.ipam.type, key))
        if reason and not is_zero(plugin.ipam.fields.get(key)):
            issues.error(where, f"never claim-settable: {reason}")
    if rules.ip_ranges is not None:
        for address in network.addresses():
            if not network.is_admin(address.raw):
                _check_address(address.text, address.path, rules, issues)
    if rules.vlan_ids is not None:
        allowed = listing(rules.vlan_ids)
        for span in network.vlans():
            if network.is_admin(span.raw):
                continue
            outside = [v for v in (span.low, span.high) if not rules.vlan_allowed(v)]
            if outside or not rules.span_allowed(span.low, span.high):
                shown = str(span.low) if span.low == span.high else f"{span.low}-{span.high}"
                issues.error(span.path, f"VLAN {shown} is not allowed; allowed: {allowed}")
    return network


def _check_sysctls(sysctls: Any, where: FieldPath, issues: Issues) -> None:
    """tuning writes /proc/sys/net in the pod's namespace; a few keys reach beyond the pod."""
    if not isinstance(sysctls, Mapping):
        return
    for key in sysctls:
        name = str(key).replace("/", ".")
        if name in NODE_WIDE_SYSCTLS:
            issues.error(
                where / key,
                "never claim-settable: a network namespace shares this key with the node",
            )
        elif name.rsplit(".", 1)[-1] in PROXY_SYSCTLS:
            issues.error(
                where / key,
                "never claim-settable: makes the pod answer on the segment for addresses that "
                "are not its own",
            )


# CNI_ARGS the IPAM plugins read addresses from (host-local: IP; static: IP and GATEWAY), a
# comma-separated list; capabilities.ips reaches them as runtimeConfig.ips
ADDRESS_ARGS = ("IP", "GATEWAY")


def _requested_addresses(path: Path, value: Any) -> list[str]:
    if path[:1] == ("args",) and len(path) == 2 and path[1] in ADDRESS_ARGS:
        return [part.strip() for part in str(value).split(",") if part.strip()]
    if path == ("capabilities", "ips") and isinstance(value, list):
        return [str(v) for v in value]
    return []


def _check_address(text: str, where: FieldPath, rules: ClaimRules, issues: Issues) -> None:
    if rules.ip_ranges is None:
        return
    if address_outside(text, rules.ip_ranges):
        issues.error(
            where,
            f"{text} is outside the ranges this DeviceClass allows: " + listing(rules.ip_ranges),
        )


def _check_type(what: str, ptype: str, path: FieldPath, rules: ClaimRules, issues: Issues) -> None:
    if ptype not in rules.plugins:
        allowed = ", ".join(rules.plugins) or "none"
        issues.error(
            path / "type",
            f"{what} {ptype!r} is not allowed for claims of this DeviceClass; allowed: {allowed}",
        )


def parent_links(conflist: Mapping[str, Any]) -> list[str]:
    """The host links a network's plugins name (macvlan's master, host-device's device...); a
    bridge is not one: the plugin creates it."""
    out = []
    for plugin in conflist.get("plugins") or []:
        if not isinstance(plugin, Mapping) or plugin.get("type") == "bridge":
            continue
        field = PARENT_FIELDS.get(str(plugin.get("type")))
        value = next((v for k, v in plugin.items() if field and k.lower() == field.lower()), None)
        if isinstance(value, str) and value:
            out.append(value)
    return out


def bind_to_device(
    conflist: Mapping[str, Any], link: str, path: FieldPath, issues: Issues
) -> dict[str, Any]:
    """The network with its parent filled from the allocated link (`link`): a plugin that takes
    a parent gets `link` where none is set, and one naming another link is refused."""
    plugins = []
    for i, original in enumerate(conflist.get("plugins") or []):
        plugin = dict(original)
        field = PARENT_FIELDS.get(str(plugin.get("type")))
        if field is not None:
            # `Master` and `MASTER` set master too (Go matches field names case-insensitively)
            spellings = [k for k in plugin if k.lower() == field.lower()]
            for key in spellings:
                named = plugin.pop(key)
                if named not in (None, "", link):
                    issues.error(
                        path / "plugins" / i / key,
                        f"names {named!r}, but the scheduler allocated {link!r}: the link "
                        "configured is the one allocated; remove the field or name that link",
                    )
            plugin[field] = link
        plugins.append(plugin)
    return {**conflist, "plugins": plugins}
