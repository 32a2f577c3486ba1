"""Turn the CNI files people already have (.conf, .conflist, Multus NetworkAttachmentDefinition)
and the workloads that use them (Multus' networks annotation) into CNIConfig-carrying
Kubernetes objects that pass the shipped classes' policy: fields cnidra owns are dropped,
whereabouts and host-local IPAM become a CNIIPPool (excluding what whereabouts holds), SR-IOV
and macvtap NADs are refused with what the admin must provide, interfaces keep the names
Multus gave them, and each change is said in a note. What would still fail the policy is
refused, naming the field, never emitted. Pure: text in, objects and notes out."""

from __future__ import annotations

import copy
import ipaddress
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import yaml

from cnidra.api.constants import API_GROUP, API_VERSION, DEVICE_CLASS_NAME, DRIVER_NAME, KIND
from cnidra.api.ipam import (
    BLOCK_SIZE_DEFAULT,
    POOL_KIND,
    PoolError,
    Route,
    pod_ref_problem,
    pool_from_object,
)
from cnidra.api.issues import ROOT, Issues
from cnidra.api.loading import LoadError, load_json, load_yaml
from cnidra.api.multus import (
    NETWORKS_ANNOTATION,
    WORKLOAD_KINDS,
    AnnotationError,
    Selection,
    parse_networks,
    pod_template,
)
from cnidra.api.netconf import to_conflist
from cnidra.api.netpolicy import (
    MNP_KIND,
    POLICY_FOR_ANNOTATION,
    TargetKind,
    decode_policy,
    decode_target,
)
from cnidra.api.plugin_schema import ifname_problem
from cnidra.api.policy import SEGMENT_BLIND_IPAM, parent_links
from cnidra.api.validate import validate_documents


class OutputKind(StrEnum):
    TEMPLATE = "ResourceClaimTemplate"
    CLAIM = "ResourceClaim"
    CNICONFIG = "CNIConfig"


class ConvertError(ValueError):
    pass


@dataclass(frozen=True)
class Source:
    config: dict[str, Any]
    name: str | None = None
    namespace: str | None = None
    from_nad: bool = False
    resource_name: str | None = None  # an SR-IOV NAD's device-plugin resource
    origin: str | None = None  # the file it was read from, to name in messages


RESOURCE_ANNOTATION = "k8s.v1.cni.cncf.io/resourceName"
SRIOV_TYPES = ("sriov", "ib-sriov")
# KubeVirt's macvtap-cni: its device plugin's resources are named after the lower link
MACVTAP_RESOURCE = "macvtap.network.kubevirt.io/"
# fields cnidra sets itself (docs/state.md): dropped from a converted config, with a note
DRIVER_OWNED = {("host-local", "dataDir"), ("tuning", "dataDir")}


@dataclass
class Conversion:
    docs: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was changed, or not carried, and why
    refused: list[str] = field(default_factory=list)  # what could not be converted, and why


NAD_KIND = "NetworkAttachmentDefinition"


def read_sources(data: str | bytes, name: str = "input") -> list[Source]:
    """The CNI configs in a file: a `.conf`/`.conflist` (strict JSON, as libcni reads it), or
    every NetworkAttachmentDefinition of a (multi-document) YAML or JSON file, other kinds
    (the Pods of an example, say) skipped."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    raw = data if isinstance(data, bytes) else data.encode()
    json_file = text.lstrip().startswith("{")
    try:
        docs = [load_json(raw, name)] if json_file else load_yaml(raw, name)
    except LoadError as exc:
        raise ConvertError(_unreadable(exc, name)) from None
    if not docs:
        raise ConvertError(f"{name} is empty")
    single = docs[0] if len(docs) == 1 and isinstance(docs[0], dict) else None
    if single is not None and "kind" not in single:
        doc = single
        if "plugins" not in doc and "type" not in doc:
            raise ConvertError(
                "not a CNI config: it has neither plugins (conflist) nor type (conf), "
                "nor is it a NetworkAttachmentDefinition"
            )
        if not json_file:
            raise ConvertError("a CNI config file is JSON (libcni reads nothing else), not YAML")
        config_name = doc.get("name") if isinstance(doc.get("name"), str) else None
        return [Source(doc, config_name, origin=name)]
    nads = [d for d in docs if isinstance(d, dict) and d.get("kind") == NAD_KIND]
    if not nads:
        kinds = ", ".join(sorted({str(d.get("kind")) for d in docs if isinstance(d, dict)}))
        found = kinds or "none"
        raise ConvertError(
            f"expected a CNI config object or a NetworkAttachmentDefinition; found {found}"
        )
    return [_from_nad(nad, name) for nad in nads]


def _unreadable(exc: LoadError, name: str) -> str:
    """A file that is not YAML, said once with the file's name; two objects run together
    (`cat a.yaml b.yaml` without `---` between them) told as such."""
    message = str(exc)
    if not message.startswith(f"{name}:"):
        message = f"{name}: {message}"
    if re.search(r"duplicate key '(apiVersion|kind|metadata|spec)'", message):
        message += (
            " (two objects run together? Separate YAML documents with a line `---`, e.g. "
            "`{ cat upf.yaml; echo ---; cat nads.yaml; } > have.yaml`, or give one "
            "`kubectl get -o yaml` List)"
        )
    return message


@dataclass(frozen=True)
class Held:
    """An address whereabouts has handed out (an IPPool allocation or an
    OverlappingRangeIPReservation), and to whom (`namespace/pod`)."""

    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    pod: str
    source: str  # the whereabouts object that says so, for messages


@dataclass
class Inputs:
    sources: list[Source] = field(default_factory=list)
    workloads: list[dict[str, Any]] = field(default_factory=list)
    held: list[Held] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # whereabouts objects that could not be read
    policies: list[dict[str, Any]] = field(default_factory=list)  # MultiNetworkPolicies


WHEREABOUTS_GROUP = "whereabouts.cni.cncf.io"
IPPOOL_KIND = "IPPool"
RESERVATION_KIND = "OverlappingRangeIPReservation"


def read_all(data: str | bytes, name: str = "input") -> Inputs:
    """The NADs (or the one CNI config), the workloads carrying Multus' networks annotation,
    and the addresses whereabouts holds (its IPPools and OverlappingRangeIPReservations, as
    `kubectl get -o yaml` prints them) in a file."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    raw = data if isinstance(data, bytes) else data.encode()
    try:
        if text.lstrip().startswith("{"):  # a CNI file, or `kubectl get -o json`
            docs = [load_json(raw, name)]
            if not isinstance(docs[0], dict) or "kind" not in docs[0]:
                return Inputs(read_sources(data, name))
        else:
            docs = load_yaml(raw, name)
    except LoadError as exc:
        raise ConvertError(_unreadable(exc, name)) from None
    docs = [d for doc in docs for d in _items(doc)]
    out = Inputs()
    out.held, out.notes = read_held(docs)
    workloads = [d for d in docs if isinstance(d, dict) and d.get("kind") in WORKLOAD_KINDS]
    out.workloads = [w for w in workloads if NETWORKS_ANNOTATION in _annotations(w)]
    nads = [d for d in docs if isinstance(d, dict) and d.get("kind") == NAD_KIND]
    out.policies = [d for d in docs if isinstance(d, dict) and d.get("kind") == MNP_KIND]
    if out.workloads or nads:
        out.sources = [_from_nad(nad, name) for nad in nads]
    elif not out.policies:
        out.sources = read_sources(data, name)
    return out


def read_inputs(
    data: str | bytes, name: str = "input"
) -> tuple[list[Source], list[dict[str, Any]]]:
    """The NADs (or the one CNI config) and the workloads carrying Multus' networks
    annotation in a file."""
    found = read_all(data, name)
    return found.sources, found.workloads


def _whereabouts(doc: Any, kind: str) -> bool:
    return (
        isinstance(doc, dict)
        and doc.get("kind") == kind
        and str(doc.get("apiVersion", "")).startswith(f"{WHEREABOUTS_GROUP}/")
    )


def read_held(docs: Sequence[Any]) -> tuple[list[Held], list[str]]:
    """What whereabouts holds, from its objects: an IPPool's `spec.allocations` keyed by the
    address's offset (decimal) from the address of `spec.range`, each with its `podref`; an
    OverlappingRangeIPReservation named by its address (IPv6 with `-` for `:`, perhaps after
    the network's name), with `spec.podref`. An object that cannot be read is said in a note
    (its addresses are then not known to be held)."""
    held: list[Held] = []
    notes: list[str] = []
    for doc in docs:
        if _whereabouts(doc, IPPOOL_KIND):
            found, problem = _pool_allocations(doc)
            held += found
        elif _whereabouts(doc, RESERVATION_KIND):
            found, problem = _reservation(doc)
            held += found
        else:
            continue
        if problem:
            notes.append(problem)
    return held, notes


def _object_name(doc: Mapping[str, Any]) -> str:
    meta = doc.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    namespace = meta.get("namespace")
    name = str(meta.get("name") or "(unnamed)")
    return f"{doc.get('kind')} {namespace + '/' if isinstance(namespace, str) else ''}{name}"


def _pool_allocations(doc: Mapping[str, Any]) -> tuple[list[Held], str | None]:
    what = f"whereabouts {_object_name(doc)}"
    spec = doc.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    try:
        base = ipaddress.ip_interface(str(spec.get("range")))
    except ValueError:
        return [], (
            f"{what}: spec.range {spec.get('range')!r} is not a CIDR, so its allocations are "
            "not known to be held; exclude them from the pool by hand"
        )
    allocations = spec.get("allocations") or {}
    if not isinstance(allocations, Mapping):
        return [], f"{what}: spec.allocations is not a map of offsets; its addresses are not read"
    held: list[Held] = []
    bad: list[str] = []
    for offset, allocation in allocations.items():
        try:
            number = int(str(offset), 10)
            address = base.ip + number
        except (ValueError, ipaddress.AddressValueError):
            bad.append(str(offset))
            continue
        if number < 0 or address not in base.network:
            bad.append(str(offset))
            continue
        pod = allocation.get("podref") if isinstance(allocation, Mapping) else None
        held.append(Held(address, str(pod or "?"), what))
    problem = None
    if bad:
        problem = (
            f"{what}: spec.allocations {', '.join(sorted(bad)[:5])} are not offsets (decimal) "
            f"into {base.network}; those addresses are not known to be held"
        )
    return held, problem


def _reservation(doc: Mapping[str, Any]) -> tuple[list[Held], str | None]:
    what = f"whereabouts {_object_name(doc)}"
    meta = doc.get("metadata")
    name = str((meta if isinstance(meta, Mapping) else {}).get("name") or "")
    spec = doc.get("spec")
    pod = (spec if isinstance(spec, Mapping) else {}).get("podref")
    # the name is the address, IPv6's ':' written '-', maybe after the network's name and '-':
    # every reading is kept (a pool excludes only those in its ranges)
    cut = [0, *[i + 1 for i, c in enumerate(name) if c == "-"]]
    found: dict[Any, Held] = {}
    for start in cut:
        tail = name[start:]
        for text in (tail, tail.replace("-", ":")):
            try:
                address = ipaddress.ip_address(text)
            except ValueError:
                continue
            found.setdefault(address, Held(address, str(pod or "?"), what))
    if not found:
        return [], f"{what}: its name is not an address, so what it reserves is not known"
    return list(found.values()), None


def _items(doc: Any) -> list[Any]:
    """A `kind: List` (what `kubectl get -o yaml` gives) is its items."""
    if isinstance(doc, dict) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
        return list(doc["items"])
    return [doc]


def _annotations(workload: Mapping[str, Any]) -> Mapping[str, Any]:
    template = pod_template(workload) or {}
    meta = template.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    return annotations if isinstance(annotations, dict) else {}


def read_source(text: str | bytes) -> Source:
    """The first (usually only) config of `read_sources`."""
    return read_sources(text)[0]


def _from_nad(nad: dict[str, Any], origin: str | None = None) -> Source:
    meta = nad.get("metadata")
    spec = nad.get("spec")
    if not isinstance(meta, dict):
        raise ConvertError("NetworkAttachmentDefinition metadata must be an object")
    if spec is not None and not isinstance(spec, dict):
        raise ConvertError("NetworkAttachmentDefinition spec must be an object")
    name = meta.get("name")
    raw = (spec or {}).get("config")
    if not isinstance(raw, str):
        annotations = meta.get("annotations")
        resource = (annotations if isinstance(annotations, dict) else {}).get(RESOURCE_ANNOTATION)
        why = f" (it names only the resource {resource})" if resource else ""
        raise ConvertError(
            f"NetworkAttachmentDefinition {name} has no spec.config string{why}: its config "
            "lives in a file on each node, which cannot be converted from the NAD alone"
        )
    try:
        config = load_json(raw, "spec.config")
    except LoadError as exc:
        raise ConvertError(str(exc)) from None
    if not isinstance(config, dict):
        raise ConvertError("spec.config must hold a JSON object")
    if "name" not in config and isinstance(name, str):
        config = {"name": name, **config}  # the multi-net spec injects the NAD name
    namespace = meta.get("namespace")
    annotations = meta.get("annotations")
    resource = (annotations if isinstance(annotations, dict) else {}).get(RESOURCE_ANNOTATION)
    return Source(
        config,
        name if isinstance(name, str) else None,
        namespace if isinstance(namespace, str) else None,
        from_nad=True,
        resource_name=resource if isinstance(resource, str) else None,
        origin=origin,
    )


def dns_label(text: str, fallback: str = "network") -> str:
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:63].strip("-")
    return label or fallback


def to_document(
    source: Source,
    kind: OutputKind = OutputKind.TEMPLATE,
    name: str | None = None,
    if_name: str | None = "net1",
    reference: bool = False,
) -> dict[str, Any]:
    """`reference`: a claim that references the NAD (used as it is) instead of embedding a
    copy of its config. A network naming its parent link selects that link, so the scheduler
    allocates the link the config names."""
    if reference and not (source.from_nad and source.name):
        raise ConvertError("only a NetworkAttachmentDefinition can be referenced")
    base = dns_label(name or source.name or "network")
    params: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND}
    if if_name:
        params["ifName"] = if_name
    if reference:
        params["network"] = {"attachmentDefinition": source.name}
    else:
        params["config"] = source.config
    if kind is OutputKind.CNICONFIG:
        return params
    request = base
    exactly: dict[str, Any] = {"deviceClassName": DEVICE_CLASS_NAME}
    parent = _parent(source.config)
    if parent:
        selector = f'device.attributes["{DRIVER_NAME}"].ifName == "{parent}"'
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    devices = {
        "requests": [{"name": request, "exactly": exactly}],
        "config": [
            {"requests": [request], "opaque": {"driver": DRIVER_NAME, "parameters": params}}
        ],
    }
    metadata: dict[str, Any] = {"name": base}
    if source.namespace:
        metadata["namespace"] = source.namespace
    spec = {"spec": {"devices": devices}} if kind is OutputKind.TEMPLATE else {"devices": devices}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": str(kind),
        "metadata": metadata,
        "spec": spec,
    }


def _parent(config: Mapping[str, Any]) -> str | None:
    """The link a selector can name (a link name, not a template or an odd string): the
    parent a plugin names, or the bridge a bridge plugin joins (cnidra allocates it as a link
    and binds the config to it)."""
    conflist = to_conflist(config)
    bridges = [
        str(p.get("bridge"))
        for p in conflist.get("plugins") or []
        if isinstance(p, Mapping) and p.get("type") == "bridge" and p.get("bridge")
    ]
    for link in [*parent_links(conflist), *bridges]:
        if re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", link):
            return link
    return None


# ------------------------------------------------------------------ adapting a config


class Refused(ConvertError):
    """A source cnidra cannot take as it is; the message says what the admin must provide."""


def describe(source: Source) -> str:
    """How messages name a source: the NAD, or the CNI file and its network."""
    if source.from_nad:
        return f"{NAD_KIND} {source.namespace + '/' if source.namespace else ''}{source.name}"
    where = f" ({source.origin})" if source.origin else ""
    return f"CNI config {source.name or '(unnamed)'}{where}"


def refuse_devices(source: Source) -> None:
    """Raises Refused for a network whose device another device plugin allocates (SR-IOV,
    KubeVirt's macvtap): converted or referenced, cnidra cannot give it as Multus did."""
    what = describe(source)
    listed = source.config.get("plugins")
    plugins: list[Any] = listed if isinstance(listed, list) else [source.config]
    types = [str(p.get("type")) for p in plugins if isinstance(p, dict)]
    resource = source.resource_name or ""
    if "macvtap" in types or resource.startswith(MACVTAP_RESOURCE):
        lower = resource.removeprefix(MACVTAP_RESOURCE) or "the link its resource names"
        raise Refused(
            f"{what} is a KubeVirt macvtap network (type macvtap, device-plugin resource "
            f"{resource or 'none named'}): its macvtap device on {lower} is made by KubeVirt's "
            "macvtap device plugin and CNI plugin, and cnidra runs neither (the shipped class "
            "allows no macvtap plugin, and cnidra publishes no macvtap devices). Not converted: "
            "keep this VM network on Multus, or move the VM to a binding that takes a macvlan "
            f"or bridge interface, whose network cnidra can give (a claim selecting {lower})"
        )
    if source.resource_name or any(t in SRIOV_TYPES for t in types):
        raise Refused(
            f"{what} is an SR-IOV network (device-plugin resource "
            f"{source.resource_name or 'none named'}): cnidra allocates VFs as devices of its "
            "own, selected by attribute, and moves one into the pod with host-device; the admin "
            "makes a DeviceClass for the VFs (see examples/sriov-vf.yaml: their pciVendor and "
            "pciDevice, from `lspci -nn`) and the workload claims from it. Not converted."
        )


def adapt(
    source: Source, namespace: str | None = None, held: Sequence[Held] = ()
) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    """The source's config as the shipped classes take it, the objects it needs besides (a
    CNIIPPool for whereabouts or host-local IPAM), and notes on what changed. `namespace`: where
    the claims that carry the config go (default: the source's), which a pool must serve;
    `held`: the addresses whereabouts holds, which a pool made of whereabouts IPAM excludes."""
    what = describe(source)
    served = namespace or source.namespace or "default"
    config = copy.deepcopy(source.config)
    notes: list[str] = []
    extra: list[dict[str, Any]] = []
    persistent = config.pop("allowPersistentIPs", None) if "plugins" in config else None
    listed = config.get("plugins")
    plugins: list[Any] = listed if isinstance(listed, list) else [config]
    if persistent is None:
        for plugin in plugins:
            if isinstance(plugin, dict) and "allowPersistentIPs" in plugin:
                persistent = plugin.pop("allowPersistentIPs")
    refuse_devices(source)
    for plugin in plugins:
        if not isinstance(plugin, dict):
            continue
        ipam = plugin.get("ipam")
        for owner in (plugin, ipam):
            if not isinstance(owner, dict):
                continue
            for key in [k for k in owner if (str(owner.get("type")), k) in DRIVER_OWNED]:
                notes.append(
                    f"{what}: {owner.get('type')} {key} {owner[key]!r} dropped: cnidra keeps "
                    "each network's state under its own root (docs/state.md)"
                )
                del owner[key]
        if isinstance(ipam, dict) and ipam.get("type") == "whereabouts":
            pool = _whereabouts_pool(ipam, source, what, served)
            extra.append(pool)
            kept = {k: ipam[k] for k in ("routes", "dns") if k in ipam}
            plugin["ipam"] = {"type": "cnidra", "pool": pool["metadata"]["name"], **kept}
            notes.append(
                f"{what}: whereabouts IPAM became CNIIPPool {pool['metadata']['name']} (emitted "
                "above; apply it once, as the admin: pools are cluster-scoped) and "
                '{"type": "cnidra"} IPAM'
            )
            notes.append(_reserve_held(pool, held, what))
        elif isinstance(ipam, dict) and ipam.get("type") == "host-local":
            pool, kept, pool_notes = _host_local_pool(ipam, source, what, served)
            extra.append(pool)
            name = pool["metadata"]["name"]
            plugin["ipam"] = {"type": "cnidra", "pool": name, **kept}
            unnamed = (
                ""
                if source.namespace or namespace
                else " (the input names no namespace: put the claims' one in spec.namespaces)"
            )
            notes.append(
                f"{what}: host-local IPAM became CNIIPPool {name} (emitted before the claims; "
                "apply it once, as the admin: pools are cluster-scoped), serving namespace "
                f'{served}{unnamed}, and {{"type": "cnidra", "pool": "{name}"}} IPAM: host-local '
                "in a claim's network is refused, as it keeps one pool per network name and "
                "node, so two namespaces, or two nodes on one L2 segment, hand out the same "
                "addresses; the pool's addresses are unique cluster-wide. Addresses host-local "
                "handed out are not carried over: move workloads in a window or exclude those "
                "in use"
            )
            notes += pool_notes
    notes += _persistent_ips(persistent, extra, what)
    return config, extra, notes


def _persistent_ips(value: Any, pools: Sequence[dict[str, Any]], what: str) -> list[str]:
    """OVN-Kubernetes' `allowPersistentIPs` in a NAD's config: IPAMClaims may hold the
    network's addresses. It becomes the pool's `allowPersistentIPs`, which lets a claim's
    `ipamClaimReference` (a selection element's `ipam-claim-reference`) keep them."""
    if value is None:
        return []
    if value is not True:
        return [f"{what}: allowPersistentIPs {value!r} dropped (only true asks for anything)"]
    if not pools:
        return [
            f"{what}: allowPersistentIPs dropped: cnidra keeps addresses in IPAMClaims only "
            "from a CNIIPPool (whereabouts or host-local IPAM becomes one; this NAD's IPAM "
            "does not)"
        ]
    for pool in pools:
        pool["spec"]["allowPersistentIPs"] = True
    names = ", ".join(p["metadata"]["name"] for p in pools)
    return [
        f"{what}: allowPersistentIPs became CNIIPPool {names}'s allowPersistentIPs: a claim "
        "whose CNIConfig names an IPAMClaim (ipamClaimReference, from a selection element's "
        "ipam-claim-reference) keeps its addresses in it across pods and nodes (docs/ipam.md)"
    ]


def _whereabouts_pool(
    ipam: Mapping[str, Any], source: Source, what: str, namespace: str
) -> dict[str, Any]:
    """A CNIIPPool with whereabouts' ranges: `range` (a CIDR, or `first-last/prefix`),
    `range_start`, `range_end`, `exclude`, `gateway`, and `ipRanges` for more families. What
    a pool cannot hold (a field that is not an address, two ranges of one family) is refused,
    naming the field."""
    listed = ipam.get("ipRanges")
    if listed is not None and not isinstance(listed, list):
        raise Refused(f"{what}: whereabouts ipam.ipRanges is not a list of ranges")
    entries = [("ipam", ipam), *[(f"ipam.ipRanges[{i}]", r) for i, r in enumerate(listed or [])]]
    ranges: list[dict[str, Any]] = []
    exclude: list[Any] = []
    families: dict[int, str] = {}
    for at, entry in entries:
        if not isinstance(entry, Mapping):
            raise Refused(f"{what}: whereabouts {at} is not a range object ({{range, ...}})")
        if entry.get("range") is None and at == "ipam":
            continue
        subnet, item, excluded = _whereabouts_range(entry, at, what)
        if subnet.version in families:
            raise Refused(
                f"{what}: whereabouts {families[subnet.version]}.range and {at}.range are both "
                f"IPv{subnet.version}: whereabouts gives a pod an address of each, a CNIIPPool "
                "one per address family. Not converted: keep one range per family (or make the "
                "pool by hand, docs/ipam.md) and convert it again"
            )
        families[subnet.version] = at
        ranges.append(item)
        exclude += excluded
    if not ranges:
        raise Refused(f"{what}: whereabouts IPAM without a range cannot become a pool")
    spec: dict[str, Any] = {"ranges": ranges, "namespaces": [namespace]}
    if exclude:
        spec["exclude"] = [str(n) for n in exclude]
    return _checked_pool(source, spec, what, "whereabouts")


def _whereabouts_range(
    entry: Mapping[str, Any], at: str, what: str
) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, dict[str, Any], list[Any]]:
    """One of whereabouts' ranges as a pool range, and what it excludes."""
    text = entry.get("range")
    if not isinstance(text, str):
        raise Refused(f"{what}: whereabouts {at}.range {text!r} is not a CIDR")
    start, end = entry.get("range_start"), entry.get("range_end")
    first, dash, rest = text.partition("-")
    if dash:  # 192.0.2.10-192.0.2.20/24
        last, _, prefix = rest.partition("/")
        start, end, text = start or first, end or last, f"{first}/{prefix}"
    try:
        subnet = ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise Refused(f"{what}: whereabouts {at}.range {text!r} is not a CIDR") from None
    item: dict[str, Any] = {"subnet": str(subnet)}
    gateway = entry.get("gateway")
    for key, value in (("rangeStart", start), ("rangeEnd", end), ("gateway", gateway)):
        if value is None:
            continue
        field_name = {"rangeStart": "range_start", "rangeEnd": "range_end"}.get(key, key)
        address = _address_in(value, subnet, f"{at}.{field_name}", what)
        if address is not None:
            item[key] = str(address)
    excluded = entry.get("exclude")
    if excluded is not None and not isinstance(excluded, list):
        raise Refused(f"{what}: whereabouts {at}.exclude is not a list of CIDRs")
    found: list[Any] = []
    for i, value in enumerate(excluded or []):
        try:
            found.append(ipaddress.ip_network(str(value), strict=False))
        except ValueError:
            raise Refused(
                f"{what}: whereabouts {at}.exclude[{i}] {value!r} is not a CIDR"
            ) from None
    return subnet, item, found


def _address_in(
    value: Any,
    subnet: ipaddress.IPv4Network | ipaddress.IPv6Network,
    at: str,
    what: str,
) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """A range bound or gateway of whereabouts': an address of the subnet (a gateway outside it
    is left out, as whereabouts only reports it)."""
    try:
        address = ipaddress.ip_address(str(value))
    except ValueError:
        raise Refused(f"{what}: whereabouts {at} {value!r} is not an address") from None
    if address.version != subnet.version or address not in subnet:
        if at.endswith("gateway"):
            return None
        raise Refused(f"{what}: whereabouts {at} {address} is not in {subnet}")
    return address


def _reserve_held(pool: dict[str, Any], held: Sequence[Held], what: str) -> str:
    """The addresses whereabouts holds in a pool's ranges become the pool's reservations, each
    for the pod whereabouts gave it to (its podref, `namespace/name`): that pod gets it back
    under cnidra when it keeps its name (a StatefulSet's), and no other pod gets one while
    Multus' pods run beside cnidra's. An address whose holder is not a pod's name, or that a
    pod holds twice in one family, is excluded instead. Says which, and to whom."""
    name = pool["metadata"]["name"]
    spec = pool["spec"]
    subnets = [ipaddress.ip_network(r["subnet"]) for r in spec["ranges"]]
    inside: dict[Any, Held] = {}
    for h in held:
        if any(h.address.version == n.version and h.address in n for n in subnets):
            inside.setdefault(h.address, h)
    if not inside:
        if held:
            return (
                f"{what}: none of the addresses the whereabouts objects given hold is in "
                f"CNIIPPool {name}'s ranges; nothing reserved"
            )
        return (
            f"{what}: addresses whereabouts handed out are not known (give its IPPools and "
            "OverlappingRangeIPReservations beside the NADs: `kubectl get "
            "ippools.whereabouts.cni.cncf.io,overlappingrangeipreservations."
            "whereabouts.cni.cncf.io -A -o yaml`), so CNIIPPool "
            f"{name} neither reserves nor excludes them: cnidra may hand one out that a Multus "
            "pod still holds, and a StatefulSet's pod gets a new address; move workloads in a "
            "window, or convert again with them"
        )
    checked = pool_from_object(pool)
    reservations: list[dict[str, str]] = []
    families: set[tuple[str, int]] = set()
    excluded: list[Held] = []
    for address, h in sorted(inside.items(), key=lambda kv: (kv[0].version, int(kv[0]))):
        if not checked.hands_out(address):
            continue  # the gateway or excluded already: never handed out
        if pod_ref_problem(h.pod) is None and (h.pod, address.version) not in families:
            families.add((h.pod, address.version))
            reservations.append({"address": str(address), "pod": h.pod})
        else:
            excluded.append(h)
    if reservations:
        spec["reservations"] = reservations
    if excluded:
        networks = [ipaddress.ip_network(x) for x in spec.get("exclude") or []]
        extra = [ipaddress.ip_network(h.address) for h in excluded]
        merged: list[Any] = []
        for version in (4, 6):
            same = [n for n in [*networks, *extra] if n.version == version]
            merged += ipaddress.collapse_addresses(same)
        spec["exclude"] = [str(n) for n in merged]
    shown = ", ".join(f"{r['address']} ({r['pod']})" for r in reservations[:10])
    more = f" and {len(reservations) - 10} more" if len(reservations) > 10 else ""
    parts = [
        f"{what}: the {len(reservations)} address(es) whereabouts holds in CNIIPPool {name}'s "
        f"ranges are reserved for the pods holding them (spec.reservations): {shown}{more}. A "
        "pod that keeps its name under cnidra (a StatefulSet's) gets its address back; no "
        "other pod gets one, so nothing is handed out twice while Multus' pods run beside "
        "cnidra's. Once the Multus pods are gone, delete the reservations of pods that will "
        "not come back under their names (a Deployment's)"
    ]
    if excluded:
        listed = ", ".join(f"{h.address} ({h.pod})" for h in excluded[:10])
        parts.append(
            f"{len(excluded)} held by no pod name cnidra can key (or a second address of one "
            f"family for one pod) are in its exclude instead: {listed}"
        )
    return "; ".join(parts)


def _checked_pool(source: Source, spec: dict[str, Any], what: str, ipam: str) -> dict[str, Any]:
    """The CNIIPPool of `spec` (its blocks made to fit its smallest range), as the driver will
    read it; Refused naming the IPAM it came from if the driver would not."""
    smallest = min(ipaddress.ip_network(r["subnet"]).num_addresses for r in spec["ranges"])
    if smallest < BLOCK_SIZE_DEFAULT:
        spec["blockSize"] = smallest  # a block must fit in the subnet
    pool = _pool_document(source, spec)
    try:
        pool_from_object(pool)
    except PoolError as exc:
        raise Refused(f"{what}: {ipam} IPAM cannot become a pool: {exc}") from None
    return pool


def _pool_document(source: Source, spec: dict[str, Any]) -> dict[str, Any]:
    """The CNIIPPool a source's IPAM becomes, named after the source (its namespace too: two
    NADs of one name in two namespaces are two networks)."""
    name = dns_label(f"{source.namespace or 'default'}-{source.name or 'network'}")
    return {
        "apiVersion": f"{API_GROUP}/v1alpha1",
        "kind": POOL_KIND,
        "metadata": {"name": name},
        "spec": spec,
    }


# host-local's fields: the old-style single range at the top level, and what else it reads
_RANGE_FIELDS = ("subnet", "rangeStart", "rangeEnd", "gateway")
_HOST_LOCAL_FIELDS = {"type", "ranges", "routes", "dataDir", *_RANGE_FIELDS}


@dataclass(frozen=True)
class _HostRange:
    """One range of host-local's, canonical as host-local makes it (Canonicalize): rangeStart
    defaults to the subnet's first address after the network address, rangeEnd to its last
    (IPv4: before the broadcast), and the gateway, never handed out, to the first address."""

    path: str
    subnet: ipaddress.IPv4Network | ipaddress.IPv6Network
    first: ipaddress.IPv4Address | ipaddress.IPv6Address
    last: ipaddress.IPv4Address | ipaddress.IPv6Address
    gateway: ipaddress.IPv4Address | ipaddress.IPv6Address


def _host_local_range(entry: Any, path: str, what: str) -> _HostRange:
    if not isinstance(entry, Mapping):
        raise Refused(f"{what}: host-local {path} is not a range object ({{subnet, ...}})")
    try:
        subnet = ipaddress.ip_network(str(entry.get("subnet")), strict=False)
    except ValueError:
        raise Refused(
            f"{what}: host-local {path}.subnet {entry.get('subnet')!r} is not a CIDR"
        ) from None
    last = subnet.broadcast_address - 1 if subnet.version == 4 else subnet.broadcast_address
    bounds = {"rangeStart": subnet.network_address + 1, "rangeEnd": last}
    bounds["gateway"] = subnet.network_address + 1
    for key in bounds:
        value = entry.get(key)
        if value is None:
            continue
        try:
            address = ipaddress.ip_address(str(value))
        except ValueError:
            raise Refused(f"{what}: host-local {path}.{key} {value!r} is not an address") from None
        if address.version != subnet.version or address not in subnet:
            raise Refused(f"{what}: host-local {path}.{key} {address} is not in subnet {subnet}")
        bounds[key] = address
    if int(bounds["rangeStart"]) > int(bounds["rangeEnd"]):
        raise Refused(
            f"{what}: host-local {path} hands out no address ({bounds['rangeStart']} to "
            f"{bounds['rangeEnd']} in {subnet})"
        )
    return _HostRange(path, subnet, bounds["rangeStart"], bounds["rangeEnd"], bounds["gateway"])


def _host_local_pool(
    ipam: Mapping[str, Any], source: Source, what: str, namespace: str
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """A CNIIPPool with host-local's ranges, the fields the network's cnidra IPAM keeps, and
    notes. host-local gives a pod one address of each range set (the top-level `subnet`, which
    it puts first, then each of `ranges`); a pool one of each range, at most one per address
    family. So:

    - one range set of a family: its range, the gateway host-local would claim (given, or the
      subnet's first address: host-local never hands it out and reports it) kept as the pool's;
    - ranges of one range set in one subnet with one gateway (a subnet split into pieces): one
      range from the lowest to the highest address, the addresses between the pieces excluded,
      so the pool hands out exactly what host-local did;
    - anything else (two range sets of one family, which give a pod two addresses of it, or a
      range set over two subnets) is refused, naming the field: picking one would silently
      change the pods' addresses, and which subnet the segment routes is the admin's to say.

    `routes` (dst and gw) go onto the pool's routes; a route with more (mtu, table...) stays in
    the network's IPAM, which cnidra passes on to the plugin. Other fields are not carried, with
    a note."""
    families: dict[int, str] = {}
    ranges: list[dict[str, Any]] = []
    exclude: list[str] = []
    for set_path, range_set in _host_local_sets(ipam, what):
        paths = [f"{set_path}[{j}]" for j in range(len(range_set))]
        if set_path == "ipam":
            paths = [set_path]
        parsed = [_host_local_range(e, at, what) for e, at in zip(range_set, paths, strict=True)]
        family = parsed[0].subnet.version
        if family in families:
            raise Refused(
                f"{what}: host-local {families[family]} and {set_path} are both IPv{family} "
                f"range sets: host-local gives a pod an address of each, and a CNIIPPool has one "
                f"range per address family, so its pods would get one IPv{family} address where "
                f"they had two. Not converted: keep one IPv{family} range set in the config (or "
                "make the pool by hand, docs/ipam.md) and convert it again"
            )
        families[family] = set_path
        ranges.append(_pool_range(set_path, parsed, what))
        exclude += _gaps(parsed)
    spec: dict[str, Any] = {"ranges": ranges, "namespaces": [namespace]}
    if exclude:
        spec["exclude"] = exclude
    onto_pool, own = _split_routes(ipam.get("routes"), what)
    if onto_pool:
        spec["routes"] = onto_pool
    pool = _checked_pool(source, spec, what, "host-local")
    notes: list[str] = []
    for key in sorted(k for k in ipam if k not in _HOST_LOCAL_FIELDS):
        why = (
            "a host file the driver would read into the result (put dns in the network's ipam "
            "instead: cnidra passes it on)"
            if key == "resolvConf"
            else "host-local does not read it"
        )
        notes.append(f"{what}: host-local {key} {ipam[key]!r} not carried: {why}")
    return pool, ({"routes": own} if own else {}), notes


def _host_local_sets(ipam: Mapping[str, Any], what: str) -> list[tuple[str, list[Any]]]:
    """host-local's range sets, each with where it was written, in host-local's order."""
    sets: list[tuple[str, list[Any]]] = []
    if ipam.get("subnet") is not None:  # host-local prepends the old-style range
        sets.append(("ipam", [{k: ipam[k] for k in _RANGE_FIELDS if k in ipam}]))
    listed = ipam.get("ranges")
    if listed is not None and not isinstance(listed, list):
        raise Refused(f"{what}: host-local ipam.ranges is not a list of range sets")
    for i, range_set in enumerate(listed or []):
        if not isinstance(range_set, list) or not range_set:
            raise Refused(f"{what}: host-local ipam.ranges[{i}] is not a list of ranges")
        sets.append((f"ipam.ranges[{i}]", range_set))
    if not sets:
        raise Refused(
            f"{what}: host-local IPAM has neither subnet nor ranges, so there is no range for a "
            "CNIIPPool; give it its subnet, or write ipam: {type: cnidra, pool: NAME} naming a "
            "pool (docs/ipam.md)"
        )
    return sets


def _pool_range(set_path: str, parsed: Sequence[_HostRange], what: str) -> dict[str, Any]:
    """One range set's pool range: one subnet and gateway, from its lowest to its highest
    address (rangeStart and rangeEnd written where they are not the subnet's defaults)."""
    pieces = {(r.subnet, r.gateway) for r in parsed}
    if len(pieces) > 1:
        found = ", ".join(sorted({f"{r.subnet} (gateway {r.gateway})" for r in parsed}))
        raise Refused(
            f"{what}: host-local {set_path} hands out addresses of {found}, and a CNIIPPool "
            "range is one subnet with one gateway. Not converted: keep the subnet the segment "
            "routes in the config (or make the pool by hand, docs/ipam.md) and convert it again"
        )
    [(subnet, gateway)] = pieces
    first = min((r.first for r in parsed), key=int)
    last = max((r.last for r in parsed), key=int)
    item: dict[str, Any] = {"subnet": str(subnet)}
    if first != subnet.network_address + 1:
        item["rangeStart"] = str(first)
    if last != subnet.broadcast_address - (1 if subnet.version == 4 else 0):
        item["rangeEnd"] = str(last)
    item["gateway"] = str(gateway)
    return item


def _split_routes(routes: Any, what: str) -> tuple[list[dict[str, Any]], list[Any]]:
    """host-local's routes: those a pool holds (dst, gw), and those the network's IPAM keeps."""
    if routes is None:
        return [], []
    if not isinstance(routes, list):
        raise Refused(f"{what}: host-local ipam.routes is not a list of routes")
    onto_pool: list[dict[str, Any]] = []
    own: list[Any] = []
    for route in routes:
        if isinstance(route, Mapping) and set(route) <= {"dst", "gw"} and _is_route(route):
            onto_pool.append(dict(route))
        else:
            own.append(route)
    return onto_pool, own


def _gaps(parsed: Sequence[_HostRange]) -> list[str]:
    """The addresses between ranges of one subnet, as CIDRs: what a pool spanning them excludes."""
    make = ipaddress.IPv6Address if parsed[0].subnet.version == 6 else ipaddress.IPv4Address
    held = sorted((int(r.first), int(r.last)) for r in parsed)
    found: list[str] = []
    reach = held[0][1]
    for low, high in held[1:]:
        if low > reach + 1:
            gap = ipaddress.summarize_address_range(make(reach + 1), make(low - 1))
            found += [str(n) for n in gap]
        reach = max(reach, high)
    return found


def _is_route(route: Mapping[str, Any]) -> bool:
    try:
        Route.model_validate(route)
    except ValueError:
        return False
    return True


# ------------------------------------------------------------------ whole inputs


# The default DeviceClass deploy/deviceclass.yaml and the chart ship (rendered from
# charts/cnidra/templates/deviceclasses.yaml; tests/api/test_convert_policy.py keeps the two
# equal): what convert's output must pass when no admin class is given.
SHIPPED_CLASS: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": DEVICE_CLASS_NAME},
    "spec": {
        "selectors": [
            {
                "cel": {
                    "expression": f'device.driver == "{DRIVER_NAME}" && '
                    f'!device.attributes["{DRIVER_NAME}"].nodeLink && '
                    f'device.attributes["{DRIVER_NAME}"].type != "network"'
                }
            }
        ],
        "config": [
            {
                "opaque": {
                    "driver": DRIVER_NAME,
                    "parameters": {
                        "apiVersion": API_VERSION,
                        "kind": "CNIPolicy",
                        "claims": {
                            "defineNetworks": True,
                            "fields": ["ipamClaimReference"],
                            "plugins": [
                                "macvlan",
                                "ipvlan",
                                "vlan",
                                "bridge",
                                "tuning",
                                "sbr",
                                "vrf",
                                "static",
                                "cnidra",
                            ],
                        },
                    },
                }
            }
        ],
    },
}


def convert(
    sources: Sequence[Source],
    workloads: Sequence[Mapping[str, Any]] = (),
    kind: OutputKind = OutputKind.TEMPLATE,
    name: str | None = None,
    if_name: str | None = None,
    reference: bool = False,
    held: Sequence[Held] = (),
    policy: Sequence[Any] | None = None,
    network_policies: Sequence[Mapping[str, Any]] = (),
) -> Conversion:
    """NADs (or a CNI file) into claims or templates; workloads with Multus' networks
    annotation into one template each plus the workload rewritten to claim it, each interface
    named as Multus named it. Everything emitted passes `policy` (DeviceClasses; default: the
    shipped class) as `cnidra validate --policy` judges it; a NAD or workload whose output
    would not is refused, naming each field. `held`: addresses whereabouts holds, excluded from
    the pools made of whereabouts IPAM. `network_policies`: MultiNetworkPolicies, carried
    over (`carry_policies`) after what they apply to."""
    out = Conversion()
    _convert_networks(sources, workloads, kind, name, if_name, reference, held, policy, out)
    copied = {} if reference and not workloads else copied_networks(sources)
    carry_policies(network_policies, copied, out, referenced=reference and not workloads)
    return out


def _convert_networks(
    sources: Sequence[Source],
    workloads: Sequence[Mapping[str, Any]],
    kind: OutputKind,
    name: str | None,
    if_name: str | None,
    reference: bool,
    held: Sequence[Held],
    policy: Sequence[Any] | None,
    out: Conversion,
) -> None:
    if if_name is not None:
        problem = ifname_problem(if_name)
        if problem:
            raise ConvertError(f"--if-name {if_name!r}: {problem}")
        if workloads:
            raise ConvertError(
                "--if-name names the interface of a NAD or CNI file's claim; a workload's "
                "interface names come from its networks annotation"
            )
        if len(sources) > 1:
            raise ConvertError(
                f"--if-name names one interface, and the input has {len(sources)} networks: "
                "a pod claiming two of them would get two interfaces of that name; convert "
                "each NAD on its own, or leave --if-name out (cnidra names them net1, net2, ...)"
            )
    classes = list(policy) if policy else [SHIPPED_CLASS]
    if workloads:
        nads = {f"{s.namespace or 'default'}/{s.name}": s for s in sources if s.from_nad}
        for workload in workloads:
            _convert_workload(workload, nads, out, held, classes)
        return
    for source in sources:
        what = describe(source)
        try:
            if reference:
                refuse_devices(source)
                doc = to_document(source, kind, name, if_name, reference=True)
                checked = to_document(source, OutputKind.TEMPLATE, name, if_name, reference=True)
                extra: list[dict[str, Any]] = []
                notes: list[str] = []
                context = [_nad_document(source)]
            else:
                config, extra, notes = adapt(source, held=held)
                adapted = Source(config, source.name, source.namespace, source.from_nad)
                doc = to_document(adapted, kind, name, if_name)
                checked = to_document(adapted, OutputKind.TEMPLATE, name, if_name)
                context = []
        except Refused as exc:
            out.refused.append(str(exc))
            continue
        problems = policy_problems([*extra, checked], [*classes, *context])
        if problems:
            hints = _refused_as_written(source) if reference else []
            out.refused.append(_not_passing(what, problems, classes, hints))
            continue
        _add_docs(out, extra)
        out.notes += notes
        out.docs.append(doc)


def copied_networks(sources: Sequence[Source]) -> dict[str, str]:
    """Each NAD (`ns/name`) whose config a conversion copies into claims: the config's name,
    which names the claims' network (`claim:<ns>/<config name>`, docs/network-policy.md)."""
    return {
        f"{s.namespace or 'default'}/{s.name}": str(s.config.get("name") or s.name)
        for s in sources
        if s.from_nad and s.name
    }


def carry_policies(
    policies: Sequence[Mapping[str, Any]],
    copied: Mapping[str, str],
    out: Conversion,
    *,
    referenced: bool = False,
) -> None:
    """A Multus user's MultiNetworkPolicies, carried over: cnidra reads the same CRD and the
    same `policy-for`, so each is printed as written, except that a NAD whose config the
    conversion copied into claims (`copied`: the claims' interfaces are then on the claim's
    network, `claim:<policy's namespace>/<config name>`) gets that network added beside it.
    The NAD stays named: the policy keeps applying to the pods Multus still attaches during a
    migration (Multus' and OVN-Kubernetes' readers of `policy-for` match no NAD by the added
    name). A policy cnidra would not apply is not carried, with its errors."""
    for doc in policies:
        meta = doc.get("metadata") if isinstance(doc.get("metadata"), Mapping) else {}
        assert isinstance(meta, Mapping)
        label = f"MultiNetworkPolicy {meta.get('namespace') or 'default'}/{meta.get('name')}"
        found, issues = decode_policy(doc)
        if found is None:
            errors = "; ".join(f"{e.path}: {e.message}" for e in issues.errors)
            out.refused.append(f"{label}: cnidra would not apply it: {errors}")
            continue
        named = {t.key for t in found.targets}
        added: list[str] = []
        for target in found.targets:
            config = copied.get(target.key) if target.kind is TargetKind.NAD else None
            network = f"claim:{found.namespace}/{config}"
            if config is None or network in named or network in added:
                continue
            if decode_target(network, found.namespace, ROOT, Issues()) is None:
                out.notes.append(
                    f"{label}: the claims copying {target} are on {network}, which policy-for "
                    "cannot name (the config's name is no DNS subdomain): rename the config"
                )
                continue
            added.append(network)
        carried = copy.deepcopy(dict(doc))
        if added:
            annotations = carried["metadata"]["annotations"]
            written = str(annotations[POLICY_FOR_ANNOTATION]).strip()
            annotations[POLICY_FOR_ANNOTATION] = ", ".join([written, *added])
            out.notes.append(
                f"{label}: policy-for gets {', '.join(added)} beside the NADs it names: the "
                "converted claims copy those NADs' configs, so their interfaces are on the "
                "claim's network; the NADs stay, for the pods Multus still attaches"
            )
        else:
            how = (
                "the claims reference its NADs (--reference), so their interfaces are on them"
                if referenced
                else "cnidra reads MultiNetworkPolicy and policy-for as Multus does; an interface "
                "is on a NAD when its claim references the NAD (convert --reference), and on "
                "claim:<namespace>/<config name> when it copies the config: convert the policy "
                "with those NADs or workloads to have that network added"
            )
            out.notes.append(f"{label}: carried over unchanged: {how}")
        out.docs.append(carried)


def policy_problems(docs: Sequence[Any], context: Sequence[Any]) -> list[str]:
    """Every error `cnidra validate --policy` finds in `docs`, given `context` (DeviceClasses,
    and the NADs referenced), each as `Kind name: field: why`."""
    reports = validate_documents(docs, context)
    return [
        f"{r.kind} {r.name}: {issue.path}: {issue.message}"
        for r in reports
        for issue in r.issues.errors
    ]


def _not_passing(
    what: str,
    problems: Sequence[str],
    classes: Sequence[Any],
    hints: Sequence[str] = (),
    fix: str = "change the NAD",
) -> str:
    names = sorted(
        {
            str((c.get("metadata") or {}).get("name"))
            for c in classes
            if isinstance(c, Mapping) and c.get("kind") == "DeviceClass"
        }
    )
    whose = "the shipped class" if classes == [SHIPPED_CLASS] else "the classes given"
    told = "; ".join(problems)
    advice = " ".join(hints)
    return (
        f"{what}: its converted form does not pass {whose} ({', '.join(names)}), so it is not "
        f"converted (claims carrying it would be refused at admission or prepare): {told}. "
        "What the class's CNIPolicy does not allow, an admin class can (docs/security.md; "
        "check against it with `cnidra convert --policy CLASS.yaml`); what is never "
        f"claim-settable, no class allows: {fix}" + (f". {advice}" if advice else "")
    )


def _nad_document(source: Source) -> dict[str, Any]:
    """The NAD a source was read from, as the validator takes it (for --reference)."""
    meta: dict[str, Any] = {"name": source.name}
    if source.namespace:
        meta["namespace"] = source.namespace
    if source.resource_name:
        meta["annotations"] = {RESOURCE_ANNOTATION: source.resource_name}
    return {
        "apiVersion": "k8s.cni.cncf.io/v1",
        "kind": NAD_KIND,
        "metadata": meta,
        "spec": {"config": json.dumps(source.config)},
    }


def _refused_as_written(source: Source) -> list[str]:
    """What to do instead of referencing a NAD whose IPAM cannot know who else holds an
    address on the segment (a NAD of the claim's namespace is held as the claim's own network,
    so prepare refuses it)."""
    found = []
    for plugin in to_conflist(source.config).get("plugins") or []:
        ipam = plugin.get("ipam") if isinstance(plugin, Mapping) else None
        kind = ipam.get("type") if isinstance(ipam, Mapping) else None
        if isinstance(kind, str) and kind in SEGMENT_BLIND_IPAM and kind not in found:
            found.append(kind)
        elif kind == "whereabouts":
            return [
                f"Its whereabouts IPAM is no plugin cnidra runs: convert it instead, `cnidra "
                f"convert {source.origin or 'FILE'}` without --reference turns it into a CNIIPPool"
            ]
    command = f"cnidra convert {source.origin or 'FILE'}"
    return [
        f"Its {kind} IPAM is refused as the claim's own network: {SEGMENT_BLIND_IPAM[kind]}. "
        f"Convert it instead: `{command}` without --reference embeds its config with {kind} "
        'turned into a CNIIPPool; or change the NAD\'s ipam to {"type": "cnidra", "pool": '
        f"NAME}}, a CNIIPPool serving {source.namespace or 'its namespace'} (docs/ipam.md), "
        "and convert again"
        for kind in found
    ]


def _add_docs(out: Conversion, extra: Sequence[dict[str, Any]]) -> None:
    """The objects a config needs, each once: a pool two claims' configs use (one NAD used by
    workloads of several namespaces) serves all their namespaces."""
    for doc in extra:
        same = next(
            (
                d
                for d in out.docs
                if d.get("kind") == POOL_KIND == doc.get("kind")
                and d["metadata"]["name"] == doc["metadata"]["name"]
            ),
            None,
        )
        if same is None:
            out.docs.append(doc)
            continue
        served = same["spec"]["namespaces"]
        served += [n for n in doc["spec"]["namespaces"] if n not in served]


CLAIM_NAME = "networks"  # the pod's resourceClaims entry a converted workload gets


def _convert_workload(
    workload: Mapping[str, Any],
    nads: Mapping[str, Source],
    out: Conversion,
    held: Sequence[Held],
    classes: Sequence[Any],
) -> None:
    meta = workload.get("metadata") if isinstance(workload.get("metadata"), dict) else {}
    assert isinstance(meta, dict)
    kind, wname = str(workload.get("kind")), str(meta.get("name") or "workload")
    namespace = str(meta.get("namespace") or "default")
    what = f"{kind} {namespace}/{wname}"
    rewritten = _as_written(workload)
    template = pod_template(rewritten)
    assert template is not None
    annotations = template["metadata"]["annotations"]
    try:
        selections = parse_networks(str(annotations[NETWORKS_ANNOTATION]), namespace)
    except AnnotationError as exc:
        out.refused.append(f"{what}: {exc}")
        return
    missing = sorted({s.reference for s in selections if s.reference not in nads})
    if missing:
        out.refused.append(
            f"{what}: {NAD_KIND} {', '.join(missing)} is not in the input. Not converted: "
            "without a NAD's config cnidra cannot select the link it names (a claim that "
            "references it unselected may be allocated another link, and prepare refuses a "
            "config bound to a link other than the one allocated), nor tell an SR-IOV or "
            "macvtap network, nor check it against the class's policy. Give the NADs beside "
            f"the workload (`kubectl get net-attach-def -n {namespace} -o yaml`, after a line "
            "`---`) and convert again"
        )
        return
    spec = template.get("spec") if isinstance(template.get("spec"), dict) else None
    if spec is None:
        out.refused.append(f"{what}: its pod template has no spec")
        return
    claim_name = _claim_name(spec)
    try:
        requests, configs, extras, notes = _networks(selections, nads, namespace, held, what)
    except Refused as exc:
        out.refused.append(f"{what}: {exc}")
        return
    claim_template = dns_label(f"{wname}-networks")
    made = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": str(OutputKind.TEMPLATE),
        "metadata": {"name": claim_template, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": requests, "config": configs}}},
    }
    del annotations[NETWORKS_ANNOTATION]
    if not annotations:
        del template["metadata"]["annotations"]
    spec["resourceClaims"] = [
        *(spec.get("resourceClaims") or []),
        {"name": claim_name, "resourceClaimTemplateName": claim_template},
    ]
    _hold_containers(spec, claim_name)
    problems = policy_problems([*extras, made, rewritten], classes)
    if problems:
        fix = "change the NAD, or the annotation (two networks of one name fail under Multus too)"
        out.refused.append(_not_passing(what, problems, classes, fix=fix))
        return
    _add_docs(out, extras)
    out.notes += [n for n in notes if n not in out.notes]
    out.docs += [made, rewritten]


def _networks(
    selections: Sequence[Selection],
    nads: Mapping[str, Source],
    namespace: str,
    held: Sequence[Held],
    what: str,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """A workload's requests and their configs, the objects they need (pools) and notes.
    Multus names a network it is not told a name for by its place among the pod's networks
    (net<N>, the cluster network being 0), whether the others were named or not."""
    requests: list[dict[str, Any]] = []
    configs: list[dict[str, Any]] = []
    extras: list[dict[str, Any]] = []
    notes: list[str] = []
    for position, selection in enumerate(selections, start=1):
        request = _request_name(selection, position, {r["name"] for r in requests})
        params: dict[str, Any] = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "ifName": selection.interface or f"net{position}",
        }
        exactly: dict[str, Any] = {"deviceClassName": DEVICE_CLASS_NAME}
        config, extra, nad_notes = adapt(nads[selection.reference], namespace, held)
        extras += extra
        notes += nad_notes
        element = f"{what}: network {selection.reference}"
        carried = selection
        reference = selection.extras.get("ipam-claim-reference")
        if reference is not None and _persistent_pool(config, extra):
            params["ipamClaimReference"] = reference
            carried = replace(
                selection,
                extras={k: v for k, v in selection.extras.items() if k != "ipam-claim-reference"},
            )
            notes.append(
                f"{element} asks ipam-claim-reference={reference!r}: carried as the CNIConfig's "
                f"ipamClaimReference, so the pod keeps its addresses in IPAMClaim "
                f"{namespace}/{reference} (docs/ipam.md); every pod made from the template names "
                "that one IPAMClaim and gets its addresses (a VM's migration target should; "
                "two replicas should not)"
            )
        notes += _carry(carried, config, extra, element)
        params["config"] = config
        parent = _parent(config)
        if parent:
            selector = f'device.attributes["{DRIVER_NAME}"].ifName == "{parent}"'
            exactly["selectors"] = [{"cel": {"expression": selector}}]
        requests.append({"name": request, "exactly": exactly})
        configs.append(
            {"requests": [request], "opaque": {"driver": DRIVER_NAME, "parameters": params}}
        )
    return requests, configs, extras, notes


# what the apiserver writes into an object, which `kubectl get -o yaml` prints and `kubectl
# apply` refuses or misreads in a file (a stale resourceVersion is a conflict)
SERVER_FIELDS = (
    "resourceVersion",
    "uid",
    "creationTimestamp",
    "generation",
    "managedFields",
    "selfLink",
)
SERVER_ANNOTATIONS = (
    "kubectl.kubernetes.io/last-applied-configuration",
    "deployment.kubernetes.io/revision",
)


def _as_written(workload: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a workload without what the apiserver wrote into it (its status, and the
    metadata `kubectl get -o yaml` adds), so the output applies whether the input was a file
    someone wrote or the cluster's own objects."""
    out = copy.deepcopy(dict(workload))
    out.pop("status", None)
    meta = out.get("metadata")
    if isinstance(meta, dict):
        for key in SERVER_FIELDS:
            meta.pop(key, None)
        annotations = meta.get("annotations")
        if isinstance(annotations, dict):
            for key in SERVER_ANNOTATIONS:
                annotations.pop(key, None)
            if not annotations:
                del meta["annotations"]
    return out


def _persistent_pool(config: Mapping[str, Any], extra: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the network's IPAM is a CNIIPPool convert made that allows persistent IPs."""
    listed = config.get("plugins")
    plugins = listed if isinstance(listed, list) else [config]
    pools = {
        d["metadata"]["name"]
        for d in extra
        if d.get("kind") == POOL_KIND and d["spec"].get("allowPersistentIPs") is True
    }
    return any(
        isinstance(p, Mapping)
        and isinstance(p.get("ipam"), Mapping)
        and p["ipam"].get("type") == "cnidra"
        and p["ipam"].get("pool") in pools
        for p in plugins
    )


def _claim_name(spec: Mapping[str, Any]) -> str:
    """The pod's name for the converted claim: `networks`, or one no entry has yet."""
    listed = spec.get("resourceClaims")
    taken = (
        {c.get("name") for c in listed if isinstance(c, Mapping)}
        if isinstance(listed, list)
        else set()
    )
    name, n = CLAIM_NAME, 1
    while name in taken:
        n += 1
        name = f"{CLAIM_NAME}-{n}"
    return name


def _hold_containers(spec: dict[str, Any], claim: str) -> None:
    """Every container and init container lists the claim in `resources.claims`, so the
    fail-closed gate (docs/fail-closed.md) holds each until the pod's interfaces exist, as
    Multus starts no container before them."""
    for key in ("initContainers", "containers"):
        listed = spec.get(key)
        for container in listed if isinstance(listed, list) else []:
            if not isinstance(container, dict):
                continue
            resources = container.setdefault("resources", {})
            if not isinstance(resources, dict):
                continue
            claims = resources.setdefault("claims", [])
            if isinstance(claims, list) and not any(
                isinstance(c, Mapping) and c.get("name") == claim for c in claims
            ):
                claims.append({"name": claim})


def _request_name(selection: Selection, index: int, taken: set[str]) -> str:
    name = dns_label(selection.name, f"net{index}")[:63].strip("-") or f"net{index}"
    return name if name not in taken else f"{name[:58]}-{index}"


def _carry(
    selection: Selection, config: dict[str, Any], extra: Sequence[dict[str, Any]], what: str
) -> list[str]:
    """What a network selection element asked beyond name, namespace and interface: carried
    into the config where cnidra can carry it, each either way said in a note. Multus passes
    `ips` and `mac` as runtime capabilities, which libcni gives only to a plugin declaring
    them, so where the NAD declares none they did nothing under Multus either."""
    listed = config.get("plugins")
    plugins = [p for p in (listed if isinstance(listed, list) else [config]) if isinstance(p, dict)]
    notes: list[str] = []
    for key, value in selection.extras.items():
        asked = f"{what} asks {key}={value!r}"
        capability = {"ips": "ips", "mac": "mac"}.get(key)
        if capability and not _declares(plugins, capability):
            notes.append(
                f"{asked}: nothing changes, as Multus passes {key} only to a plugin declaring "
                f'capabilities {{"{capability}": true}} and the NAD declares none (it had no '
                "effect under Multus either)"
            )
        elif key == "ips":
            notes.append(f"{asked}: {_carry_ips(value, plugins, extra)}")
        else:
            notes.append(f"{asked}, which is not carried: {_why_not(key)}")
    return notes


def _declares(plugins: Sequence[Mapping[str, Any]], capability: str) -> bool:
    return any(
        isinstance(p.get("capabilities"), Mapping) and p["capabilities"].get(capability) is True
        for p in plugins
    )


def _carry_ips(value: Any, plugins: Sequence[dict[str, Any]], extra: Sequence[Any]) -> str:
    """`ips` as the network's static addresses, which prepare leases through the CNIIPPool
    that owns them (docs/ipam.md): the pool made of the NAD's host-local or whereabouts IPAM
    (host-local hands out an address `ips` asks for), or the admin's for static IPAM (static
    takes `ips` in place of its addresses). What it did not carry, and why."""
    owners = [p for p in plugins if isinstance(p.get("ipam"), dict)]
    texts = value if isinstance(value, list) else [value]
    try:
        asked = [ipaddress.ip_interface(str(t)) for t in texts if isinstance(t, str)]
    except ValueError:
        asked = []
    if not asked or len(asked) != len(texts):
        return f"not carried: {value!r} is not a list of addresses in CIDR notation"
    if len(owners) != 1:
        return "not carried: the network has no single IPAM to give it to"
    ipam = owners[0]["ipam"]
    kind = ipam.get("type")
    sameness = (
        "every pod of the workload asks the same address, so prepare gives it to the first and "
        "refuses the others while it holds it (under Multus they would share it)"
    )
    if kind == "static":
        ipam["addresses"] = [{"address": str(a)} for a in asked]
        return (
            "carried as the static IPAM's addresses (static takes them in place of its own, as "
            "under Multus); prepare leases each through the CNIIPPool whose range holds it, so "
            "an admin's pool serving the namespace must hold them (docs/ipam.md); " + sameness
        )
    pool_doc = next(
        (
            d
            for d in extra
            if d.get("kind") == POOL_KIND and d["metadata"]["name"] == ipam.get("pool")
        ),
        None,
    )
    if kind != "cnidra" or pool_doc is None:
        return f"not carried: the network's {kind} IPAM does not take it in a claim; " + _why_not(
            "ips"
        )
    pool = pool_from_object(pool_doc)
    entries = []
    for address in asked:
        if not pool.hands_out(address.ip) or pool.interface(address.ip) != address:
            return (
                f"not carried: {address} is not an address CNIIPPool {pool.name} hands out with "
                "that prefix length (outside its range, excluded, its gateway, or another "
                "prefix); the pod gets one of the pool's"
            )
        entry: dict[str, Any] = {"address": str(address)}
        found = pool.range_of(address.ip)
        if found is not None and found.gateway is not None:
            entry["gateway"] = str(found.gateway)
        entries.append(entry)
    static: dict[str, Any] = {"type": "static", "addresses": entries}
    routes = [*pool_doc["spec"].get("routes", []), *(ipam.get("routes") or [])]
    if routes:
        static["routes"] = routes
    if "dns" in ipam:
        static["dns"] = ipam["dns"]
    owners[0]["ipam"] = static
    return (
        f"carried as static addresses, which prepare leases through CNIIPPool {pool.name} "
        f"(the pod gets {', '.join(str(a) for a in asked)} as it did); " + sameness
    )


def _why_not(key: str) -> str:
    """What differs from Multus for a selection element's field cnidra does not carry."""
    return {
        "ips": "the shipped default class does not let a claim set capabilities.ips; an admin "
        "class whose CNIPolicy lists capabilities.ips in claims.fields can (add "
        "capabilities: {ips: [...]} to the CNIConfig), or use an IPAMClaim (docs/ipam.md)",
        "mac": "the pod's interface gets the MAC the kernel picks, not this one: the shipped "
        "default class does not let a claim choose a MAC (capabilities.mac, or tuning's mac); "
        "an admin class whose CNIPolicy lists capabilities.mac in claims.fields can "
        "(docs/security.md)",
        "default-route": "under Multus the pod's default route went through this interface; "
        "under cnidra it stays on the primary network's eth0 (cnidra never replaces it), so "
        "traffic to destinations no other route covers leaves by the cluster network; add a "
        "route for each destination that must go this way to the network's IPAM routes (or the "
        "pool's)",
        "cni-args": "the plugins do not get these CNI args: the shipped default class does not "
        "let a claim set args; an admin class whose CNIPolicy lists args in claims.fields can "
        "(the CNIConfig's args)",
        "ipam-claim-reference": "the NAD's IPAM does not read IPAMClaims; cnidra keeps a pod's "
        "addresses in one when the CNIConfig sets ipamClaimReference and its pool allows "
        "persistent IPs (docs/ipam.md)",
        "portMappings": "cnidra never maps host ports (refused whatever a class says)",
        "bandwidth": "the interface is not shaped: a claim cannot set the bandwidth capability "
        "with the shipped default class",
        "infiniband-guid": "cnidra gives no InfiniBand devices",
    }.get(key, "cnidra has no equivalent")


class _Dumper(yaml.SafeDumper):
    """PyYAML folds NEL/LS/PS inside single-quoted scalars; such strings go double-quoted."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = '"' if any(c in value for c in _UNICODE_BREAKS) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_UNICODE_BREAKS = ("\x85", "\u2028", "\u2029")
_Dumper.add_representer(str, _represent_str)


def render_yaml(doc: Any) -> str:
    return yaml.dump(
        doc,
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=100,
    )


def extract_config(doc: Any) -> Any:
    """The CNI config inside a converted document (for round-trip checks)."""
    if doc.get("kind") == KIND:
        return doc["config"]
    spec = doc["spec"]["spec"] if doc["kind"] == OutputKind.TEMPLATE else doc["spec"]
    return spec["devices"]["config"][0]["opaque"]["parameters"]["config"]
