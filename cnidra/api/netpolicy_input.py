"""Network policy over `cnidra validate`'s input (issue 43; docs/network-policy.md): which pods
and interfaces each policy selects among the Pods and workloads of the files, with their claims
(each interface named as prepare names it, on the network a policy names as `policy-for` does),
and the tenancy rule judged as the driver judges it, against the CNINetworks, DeviceClasses,
Namespaces and NADs the input holds. Pure.

The one rule of which network an interface is on, `request_target`, is prepare's too
(cnidra.dra.resolve.policy_network calls it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cnidra.api.admission_rules import POD_TEMPLATE_KINDS, namespace_of, pod_spec
from cnidra.api.claimspec import configs_for, devices_of, read_configs, request_classes
from cnidra.api.constants import DRIVER_NAME
from cnidra.api.issues import ROOT, Issues
from cnidra.api.merge import Source
from cnidra.api.naming import NamingError, Slot, assign_names
from cnidra.api.netpolicy import (
    ADMIN_KIND,
    MNP_KIND,
    POLICY_FOR_ANNOTATION,
    AdminNetworkPolicy,
    CatalogAccess,
    MultiNetworkPolicy,
    Target,
    TargetKind,
    decode_admin_policy,
    decode_policy,
    interface_target,
    tenancy_problems,
)
from cnidra.api.networks import NAD_KIND, NETWORK_KIND, NamedNetwork, StaticCatalog
from cnidra.api.policy import CLASS_CONFIG, CNIPolicy, is_policy, parse_policy
from cnidra.api.verdict import ResolvedRequest

SHOWN = 50  # interfaces listed per policy; beyond, counted


def request_target(
    resolved: ResolvedRequest, claim_namespace: str, config_name: str, device_class: str | None
) -> Target:
    """The network a request's interface is on, as `policy-for` names it: the NAD or CNINetwork
    the request (or its class) references, else the DeviceClass's own network, else the claim's
    (`claim:<ns>/<config name>`). A node conf referenced by networkID is no kind `policy-for`
    names: it counts as its class's."""
    network = resolved.network
    nad: tuple[str, str] | None = None
    cninetwork = None
    if network is not None and network.reference.startswith(NAD_KIND + " "):
        namespace, _, name = network.status_name.partition("/")
        nad = (namespace, name)
    elif network is not None and network.reference.startswith(NETWORK_KIND + " "):
        cninetwork = network.status_name
    claim_defined = any(
        e.source is Source.CLAIM and "config" in e.parameters for e in resolved.entries
    )
    return interface_target(
        claim_namespace=claim_namespace,
        config_name=config_name,
        attachment_definition=nad,
        cninetwork=cninetwork,
        device_class=device_class,
        claim_defined=claim_defined,
    )


@dataclass(frozen=True)
class InputInterface:
    """An interface a Pod (or each pod of a workload) of the input gets from its claims."""

    namespace: str
    owner: str  # "Pod web", "Deployment web (its pods)"
    labels: Mapping[str, str]
    if_name: str
    network: str  # Target.key
    claim: str  # "ResourceClaimTemplate data"

    def line(self) -> str:
        return f"{self.owner} {self.namespace}: {self.if_name} on {self.network} ({self.claim})"


def pod_labels(doc: Mapping[str, Any]) -> dict[str, str]:
    """A Pod's labels, or a workload's pod template's."""
    if doc.get("kind") == "Pod":
        meta = doc.get("metadata")
    else:
        spec = doc.get("spec")
        template = spec.get("template") if isinstance(spec, Mapping) else None
        meta = template.get("metadata") if isinstance(template, Mapping) else None
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    if not isinstance(labels, Mapping):
        return {}
    return {str(k): str(v) for k, v in labels.items()}


def input_interfaces(
    docs: Sequence[Any], resolved: Sequence[Sequence[ResolvedRequest]]
) -> list[InputInterface]:
    """Every interface the Pods and workloads of `docs` get from the claims and templates of
    `docs` (`resolved[i]`: document i's requests, as validate resolved them), in pod order,
    named as prepare names them (an unnamable pod, which validate reports, gets `?`)."""
    claims: dict[tuple[str, str, str], tuple[Mapping[str, Any], Sequence[ResolvedRequest]]] = {}
    for doc, requests in zip(docs, resolved, strict=True):
        if isinstance(doc, Mapping) and doc.get("kind") in (
            "ResourceClaim",
            "ResourceClaimTemplate",
        ):
            meta = doc.get("metadata")
            name = meta.get("name") if isinstance(meta, Mapping) else None
            if isinstance(name, str):
                claims[(str(doc["kind"]), namespace_of(doc), name)] = (doc, requests)
    found: list[InputInterface] = []
    for doc in docs:
        if not isinstance(doc, Mapping) or doc.get("kind") not in ("Pod", *POD_TEMPLATE_KINDS):
            continue
        spec, _ = pod_spec(doc)
        entries = spec.get("resourceClaims") if isinstance(spec, Mapping) else None
        if not isinstance(entries, list):
            continue
        namespace = namespace_of(doc)
        meta = doc.get("metadata")
        name = str((meta if isinstance(meta, Mapping) else {}).get("name") or "?")
        owner = f"Pod {name}" if doc["kind"] == "Pod" else f"{doc['kind']} {name} (its pods)"
        labels = pod_labels(doc)
        slots: list[Slot] = []
        wanted: list[tuple[str, str]] = []  # (network, claim) per slot
        for entry in entries:
            if not isinstance(entry, Mapping):
                continue
            for key, kind in (
                ("resourceClaimName", "ResourceClaim"),
                ("resourceClaimTemplateName", "ResourceClaimTemplate"),
            ):
                claim_name = entry.get(key)
                held = claims.get((kind, namespace, str(claim_name)))
                if not isinstance(claim_name, str) or held is None:
                    continue
                claim_doc, requests = held
                devices, base = devices_of(claim_doc)
                classes = request_classes(devices, base) if isinstance(devices, Mapping) else {}
                for request in requests:
                    if request.slot is None or request.config.config is None:
                        continue
                    config_name = str(request.config.config.get("name") or "")
                    device_class = classes.get(request.request)
                    target = request_target(request, namespace, config_name, device_class)
                    slots.append(request.slot)
                    wanted.append((target.key, f"{kind} {claim_name} request {request.request}"))
        try:
            names = assign_names(slots)
        except NamingError:
            names = ["?"] * len(slots)
        for if_name, (network, claim) in zip(names, wanted, strict=True):
            found.append(InputInterface(namespace, owner, labels, if_name, network, claim))
    return found


def namespace_labels_of(
    docs: Sequence[Any], given: Mapping[str, str] | None
) -> dict[str, dict[str, str]]:
    """Each Namespace of the input's labels; `given` (`--namespace-labels`) for the namespaces
    the input has objects in but no Namespace of."""
    labels: dict[str, dict[str, str]] = {}
    for doc in docs:
        if isinstance(doc, Mapping) and doc.get("kind") == "Namespace":
            meta = doc.get("metadata")
            if isinstance(meta, Mapping) and isinstance(meta.get("name"), str):
                raw = meta.get("labels")
                labels[meta["name"]] = (
                    {str(k): str(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}
                )
    if given is not None:
        for doc in docs:
            if isinstance(doc, Mapping) and doc.get("kind") != "Namespace":
                labels.setdefault(namespace_of(doc), dict(given))
    return labels


def class_policies(docs: Sequence[Any]) -> dict[str, CNIPolicy | None]:
    """Each DeviceClass of the input that carries cnidra's config: its CNIPolicy (None: it has
    none, so every namespace may allocate from it)."""
    found: dict[str, CNIPolicy | None] = {}
    for doc in docs:
        if not isinstance(doc, Mapping) or doc.get("kind") != "DeviceClass":
            continue
        meta = doc.get("metadata")
        name = (meta if isinstance(meta, Mapping) else {}).get("name")
        spec = doc.get("spec")
        configs = spec.get("config") if isinstance(spec, Mapping) else None
        if not isinstance(name, str) or not isinstance(configs, list):
            continue
        policy = None
        for entry in configs_for(DRIVER_NAME, read_configs(configs, CLASS_CONFIG, Issues())):
            params = entry.parameters
            if isinstance(params, Mapping) and is_policy(params):
                policy = parse_policy(params, ROOT, Issues())
        found[name] = policy
    return found


def access_of(
    docs: Sequence[Any],
    catalog: StaticCatalog,
    interfaces: Sequence[InputInterface],
    labels: Mapping[str, Mapping[str, str]],
) -> CatalogAccess:
    """The tenancy rule's view of the input: its CNINetworks, DeviceClasses, namespaces'
    labels, and the other namespaces' NADs each namespace's interfaces are on."""
    cninetworks = {
        key.removeprefix(NETWORK_KIND + " "): found
        for key, found in catalog.networks.items()
        if key.startswith(NETWORK_KIND + " ") and isinstance(found, NamedNetwork)
    }
    in_use: dict[str, set[str]] = {}
    for interface in interfaces:
        if ":" not in interface.network:
            in_use.setdefault(interface.namespace, set()).add(interface.network)
    return CatalogAccess(
        cninetworks,
        class_policies(docs),
        labels,
        {ns: frozenset(nads) for ns, nads in in_use.items()},
    )


class InputAccess:
    """The tenancy rule's answers from the input alone: a CNINetwork or DeviceClass the input
    does not hold, or another namespace's NAD while the input has no interface of the policy's
    namespace, is not judged (`unknown` says which, for a warning); the rest as CatalogAccess
    answers."""

    def __init__(self, access: CatalogAccess, interfaces: Sequence[InputInterface]) -> None:
        self.access = access
        self.namespaces = {i.namespace for i in interfaces}
        self.unknown: list[str] = []

    def __call__(self, namespace: str, target: Target) -> str | None:
        if (
            (target.kind is TargetKind.CNINETWORK and target.name not in self.access.cninetworks)
            or (
                target.kind is TargetKind.DEVICECLASS
                and target.name not in self.access.device_classes
            )
            or (target.kind is TargetKind.NAD and namespace not in self.namespaces)
        ):
            self.unknown.append(str(target))
            return None
        return self.access(namespace, target)


def selected(
    policy: MultiNetworkPolicy | AdminNetworkPolicy,
    interfaces: Sequence[InputInterface],
    labels: Mapping[str, Mapping[str, str]],
) -> list[InputInterface]:
    """The interfaces of the input `policy` selects: on a network it names, of a pod it
    selects (an admin subject's namespace labels from the input; a namespace with none known
    is matched with no labels)."""
    keys = {t.key for t in policy.targets}
    out = []
    for interface in interfaces:
        if interface.network not in keys:
            continue
        if isinstance(policy, MultiNetworkPolicy):
            chosen = policy.selects(interface.namespace, interface.labels)
        else:
            chosen = policy.selects(labels.get(interface.namespace, {}), interface.labels)
        if chosen:
            out.append(interface)
    return out


@dataclass(frozen=True)
class PolicyInInput:
    """What one policy document makes of the input: what it selects, and the tenancy rule's
    problems (a tenant's policy only)."""

    selects: tuple[str, ...]
    issues: Issues


def judge_policies(
    docs: Sequence[Any],
    resolved: Sequence[Sequence[ResolvedRequest]],
    catalog: StaticCatalog,
    given_labels: Mapping[str, str] | None = None,
) -> dict[int, PolicyInInput]:
    """For each policy document of `docs` that decodes (by index): the interfaces of the input
    it selects, and for a MultiNetworkPolicy the tenancy rule, as the driver applies it (an
    error: the driver does not apply the policy)."""
    interfaces = input_interfaces(docs, resolved)
    labels = namespace_labels_of(docs, given_labels)
    access = access_of(docs, catalog, interfaces, labels)
    out: dict[int, PolicyInInput] = {}
    for index, doc in enumerate(docs):
        if not isinstance(doc, Mapping) or doc.get("kind") not in (MNP_KIND, ADMIN_KIND):
            continue
        policy: MultiNetworkPolicy | AdminNetworkPolicy | None
        issues = Issues()
        if doc["kind"] == MNP_KIND:
            policy, _ = decode_policy(doc)
            if policy is not None:
                judged = InputAccess(access, interfaces)
                issues = tenancy_problems(policy, judged)
                where = ROOT / "metadata" / "annotations" / POLICY_FOR_ANNOTATION
                for target in judged.unknown:
                    issues.warn(
                        where,
                        f"{target}: whether {policy.namespace} may use it is not checked (the "
                        "input holds no such network, or no claim of the namespace)",
                    )
        else:
            policy, _ = decode_admin_policy(doc)
        if policy is None:
            continue
        chosen = selected(policy, interfaces, labels)
        lines = [i.line() for i in chosen[:SHOWN]]
        if len(chosen) > SHOWN:
            lines.append(f"and {len(chosen) - SHOWN} more interfaces")
        out[index] = PolicyInInput(tuple(lines), issues)
    return out
