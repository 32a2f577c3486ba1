"""Validation of the documents users write: ResourceClaim, ResourceClaimTemplate, DeviceClass,
CNINetwork, NetworkAttachmentDefinition, pods and workloads, and bare CNIConfig, each claim's
requests judged by the one verdict (cnidra.api.verdict), the shipped admission's rules too
(cnidra.api.admission_rules). Every problem is reported at once, each at a path from the
document root. The names other modules import from here before the split stay importable."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from cnidra.api.admission_rules import (
    CLAIM_CONFIG_LABEL,
    CLASSES_ANNOTATION,
    POD_TEMPLATE_KINDS,
    Admission,
    check_pod,
    namespace_of,
    pod_spec,
)
from cnidra.api.claimspec import (
    Request,
    devices_of,
    read_requests,
)
from cnidra.api.cniconfig import KNOWN_CAPABILITIES, parse_parameters
from cnidra.api.constants import (
    API_VERSION,
    DEFAULT_MAX_ATTACHMENTS,
    DRIVER_NAME,
    KIND,
    LEGACY_KIND,
    RESOURCE_API_VERSIONS,
)
from cnidra.api.ipam import POOL_KIND, PoolError, pool_from_object
from cnidra.api.issues import ROOT, FieldPath, Issues, describe, listing
from cnidra.api.loading import LoadError, load_json
from cnidra.api.merge import ConfigEntry, Source, applicable, provenance
from cnidra.api.naming import NamingError, Slot, assign_names, prefix_problem
from cnidra.api.netconf import validate_network_config
from cnidra.api.netpolicy import ADMIN_KIND, MNP_KIND, decode_admin_policy, decode_policy
from cnidra.api.netpolicy_input import judge_policies
from cnidra.api.networks import (
    NAD_KIND,
    NETWORK_KIND,
    NamedNetwork,
    NetworkCatalog,
    StaticCatalog,
    Unresolved,
    cninetwork,
    nad,
)
from cnidra.api.verdict import (
    ResolvedRequest,
    check_request,
    claim_entries,
    judged_once,
    resolve_request,
)

# what other modules import from here (some from before the split)
__all__ = [
    "CLAIM_CONFIG_LABEL",
    "CLASSES_ANNOTATION",
    "KNOWN_CAPABILITIES",
    "MAX_POD_INTERFACES",
    "POD_TEMPLATE_KINDS",
    "Admission",
    "DocumentReport",
    "Request",
    "ResolvedRequest",
    "catalog_of",
    "check_request",
    "claim_entries",
    "judged_once",
    "parse_parameters",
    "request_slot",
    "resolve_request",
    "validate_document",
    "validate_documents",
]

# the most --max-attachments-per-pod allows: a pod's interfaces are named up to this many
MAX_POD_INTERFACES = 64
MAX_HINTED = 64  # classes a "did you mean" looks through


@dataclass
class DocumentReport:
    index: int
    kind: str
    name: str | None
    issues: Issues = field(default_factory=Issues)
    # Requests of ours, merged and validated, in the order the document lists them.
    resolved: list[ResolvedRequest] = field(default_factory=list)
    # why the document is not cnidra's to judge (another driver's claim), when it is not
    skipped: str | None = None
    # a network policy: the interfaces of the input's pods it selects (docs/network-policy.md)
    selects: list[str] | None = None


# ---------------------------------------------------------------- documents


def validate_documents(
    docs: Sequence[Any],
    policy_docs: Sequence[Any] = (),
    namespace_labels: Mapping[str, str] | None = None,
    *,
    admission: Admission | None = None,
) -> list[DocumentReport]:
    """Reports for `docs`. DeviceClasses among them or in `policy_docs` (an admin's classes,
    `cnidra validate --policy`) supply their configs and CNIPolicy to the claims that use them,
    as DRA does at allocation; CNINetworks and NetworkAttachmentDefinitions among either are
    the networks claims may reference; `namespace_labels` are the labels a namespace selector
    sees. `admission`: the shipped ValidatingAdmissionPolicies' rules judged too (offline, for
    `cnidra validate`; the webhook runs behind them in the apiserver)."""
    given = _collect_classes(policy_docs)
    classes = {**given, **_collect_classes(docs)}
    catalog = catalog_of([*policy_docs, *docs])
    labels = namespace_labels or {}
    strict = bool(given)  # the cluster's classes given: one not among them is a mistake
    with judged_once():
        reports = [
            validate_document(
                doc, i, classes, labels, catalog, strict_classes=strict, admission=admission
            )
            for i, doc in enumerate(docs)
        ]
    _name_pods_interfaces(docs, reports)
    _judge_policies(docs, reports, catalog, namespace_labels)
    return reports


def _judge_policies(
    docs: Sequence[Any],
    reports: Sequence[DocumentReport],
    catalog: StaticCatalog,
    namespace_labels: Mapping[str, str] | None,
) -> None:
    """Each policy's selection among the input's pods, and the tenancy rule on its networks
    (cnidra.api.netpolicy_input)."""
    judged = judge_policies(docs, [r.resolved for r in reports], catalog, namespace_labels)
    for index, found in judged.items():
        reports[index].selects = list(found.selects)
        reports[index].issues.extend(found.issues.items)


def _name_pods_interfaces(docs: Sequence[Any], reports: Sequence[DocumentReport]) -> None:
    """A pod's interfaces across all its claims, named as prepare names them: for each Pod (or
    workload) in the input, the claims and templates it lists that are also in the input."""
    claims: dict[tuple[str, str, str], DocumentReport] = {}
    for doc, report in zip(docs, reports, strict=True):
        if report.kind in ("ResourceClaim", "ResourceClaimTemplate") and report.name:
            claims[(report.kind, namespace_of(doc), report.name)] = report
    for doc, report in zip(docs, reports, strict=True):
        if report.kind != "Pod" and report.kind not in POD_TEMPLATE_KINDS:
            continue
        spec, base = pod_spec(doc)
        entries = spec.get("resourceClaims") if isinstance(spec, dict) else None
        if not isinstance(entries, list):
            continue
        slots: list[Slot] = []
        where: list[FieldPath] = []
        for i, entry in enumerate(entries):
            path = base / "resourceClaims" / i
            found = _claim_of(entry, namespace_of(doc), claims)
            if isinstance(found, str):
                if found:
                    report.issues.warn(path, found)
                continue
            name, claim = found
            for resolved in claim.resolved:
                if resolved.slot is not None and len(slots) <= MAX_POD_INTERFACES:
                    slots.append(replace(resolved.slot, owner=f"{name} {resolved.slot.owner}"))
                    where.append(path)
        if len(slots) > MAX_POD_INTERFACES:
            report.issues.error(
                base / "resourceClaims",
                f"its claims give the pod more than {MAX_POD_INTERFACES} cnidra interfaces; "
                f"prepare refuses more than --max-attachments-per-pod ({DEFAULT_MAX_ATTACHMENTS} "
                f"by default, at most {MAX_POD_INTERFACES})",
            )
            continue
        try:
            assign_names(slots)
        except NamingError as exc:
            for index, message in exc.problems:
                report.issues.error(where[index], message)


def _claim_of(
    entry: Any, namespace: str, claims: Mapping[tuple[str, str, str], DocumentReport]
) -> tuple[str, DocumentReport] | str:
    """The claim report a pod's resourceClaims entry names, or why it is not checked ("" when
    the entry is not a claim reference at all)."""
    if not isinstance(entry, dict):
        return ""
    for key, kind in (
        ("resourceClaimName", "ResourceClaim"),
        ("resourceClaimTemplateName", "ResourceClaimTemplate"),
    ):
        name = entry.get(key)
        if isinstance(name, str):
            report = claims.get((kind, namespace, name))
            if report is None:
                return (
                    f"{kind} {namespace}/{name} is not in the input: its interface names are "
                    "not checked against the pod's other claims"
                )
            return f"pod claim {str(entry.get('name') or name)!r}", report
    return ""


def catalog_of(docs: Iterable[Any]) -> StaticCatalog:
    """The networks documents define, for references to them; the rest are offline (not
    checked, with a warning), as is every node conf."""
    catalog = StaticCatalog(offline=True)
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        meta: dict[str, Any] = doc["metadata"] if isinstance(doc.get("metadata"), dict) else {}
        name = meta.get("name")
        if not isinstance(name, str):
            continue
        found: NamedNetwork | Unresolved
        if doc.get("kind") == NETWORK_KIND:
            spec: dict[str, Any] = doc["spec"] if isinstance(doc.get("spec"), dict) else {}
            offline = Unresolved(
                f"node conf {spec.get('networkID')} is read on the node, not checked here",
                offline=True,
            )
            found = cninetwork(doc, offline)
            catalog.networks[f"{NETWORK_KIND} {name}"] = found
        elif doc.get("kind") == NAD_KIND:
            namespace = str(meta.get("namespace") or "default")
            found = nad({**doc, "metadata": {**meta, "namespace": namespace}}, trusted=False)
            catalog.networks[f"{NAD_KIND} {namespace}/{name}"] = found
    return catalog


def _collect_classes(docs: Iterable[Any]) -> dict[str, list[ConfigEntry]]:
    classes: dict[str, list[ConfigEntry]] = {}
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "DeviceClass":
            meta = doc.get("metadata")
            name = (meta if isinstance(meta, dict) else {}).get("name")
            spec = doc.get("spec") or {}
            if isinstance(name, str) and isinstance(spec, dict):
                classes[name] = claim_entries(spec, ROOT / "spec", Issues(), set(), Source.CLASS)
    return classes


def validate_document(
    doc: Any,
    index: int,
    classes: Mapping[str, list[ConfigEntry]] | None = None,
    namespace_labels: Mapping[str, str] | None = None,
    catalog: NetworkCatalog | None = None,
    *,
    strict_classes: bool = False,
    admission: Admission | None = None,
) -> DocumentReport:
    classes = classes or {}
    catalog = catalog if catalog is not None else StaticCatalog(offline=True)
    if not isinstance(doc, dict):
        report = DocumentReport(index, "?", None)
        report.issues.error(
            ROOT, f"must be a YAML mapping (a Kubernetes object), got {describe(doc)}"
        )
        return report
    kind = str(doc.get("kind", "?"))
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    report = DocumentReport(index, kind, name if isinstance(name, str) else None)
    issues = report.issues
    api_version = doc.get("apiVersion")
    if kind == NETWORK_KIND:
        _validate_network(doc, issues)
    elif kind == POOL_KIND:
        try:
            pool_from_object(doc)
        except PoolError as exc:
            issues.error(ROOT / "spec", str(exc))
    elif kind in (MNP_KIND, ADMIN_KIND) or (kind == "Namespace" and api_version == "v1"):
        _validate_policy_side(doc, kind, issues)
    elif api_version == API_VERSION or kind in (KIND, LEGACY_KIND):
        model = parse_parameters(doc, ROOT, issues, complete=True)
        if model is not None:
            entry = ConfigEntry(Source.CLAIM, doc, (), ROOT)
            # named as prepare names a claim's one interface (ifName optional: net1, or the
            # prefix's first name)
            slot = Slot("the CNIConfig", model.if_name, model.if_name_prefix)
            [name] = assign_names([slot])
            model = model.model_copy(update={"if_name": name})
            report.resolved.append(ResolvedRequest(name, model, [entry], slot=slot, judged=[entry]))
    elif kind in ("ResourceClaim", "ResourceClaimTemplate", "DeviceClass"):
        if api_version not in RESOURCE_API_VERSIONS:
            issues.error(
                ROOT / "apiVersion",
                f"{describe(api_version)} is not a DRA API version; "
                f"allowed: {', '.join(sorted(RESOURCE_API_VERSIONS))}",
            )
        if kind == "DeviceClass":
            spec = doc.get("spec") or {}
            if isinstance(spec, dict):
                claim_entries(spec, ROOT / "spec", issues, set(), Source.CLASS)
        else:
            report.resolved = _validate_claim(
                doc,
                kind,
                issues,
                classes,
                namespace_labels or {},
                catalog,
                strict_classes,
                shape=admission is not None,
            )
            if admission is not None:
                admission.judge(doc, kind, issues)
            if not report.resolved and not issues.errors and not _ours(doc, classes):
                report.skipped = (
                    f"not cnidra's: no request has a config of driver {DRIVER_NAME} or a "
                    "DeviceClass known to be cnidra's"
                )
    elif kind == NAD_KIND:
        _validate_nad(doc, issues)
    elif kind == "Pod" or kind in POD_TEMPLATE_KINDS:
        # its claims' interface names, across claims: validate_documents
        check_pod(doc, issues)
    elif "kind" not in doc and ("plugins" in doc or "type" in doc):
        # a CNI conf or conflist file as libcni reads it
        report.kind = "conflist" if "plugins" in doc else "conf"
        validate_network_config(doc, ROOT, issues, complete=True)
    else:
        _not_judged(doc, report, issues)
    return report


def _not_judged(doc: Mapping[str, Any], report: DocumentReport, issues: Issues) -> None:
    """An object of another kind (an IPAMClaim, whereabouts' IPPool) is skipped, as another
    driver's claims are; a document whose kind is missing or not a string is a warning."""
    validated = (
        f"cnidra validates ResourceClaim, ResourceClaimTemplate, DeviceClass, CNIConfig, "
        f"{NETWORK_KIND}, {POOL_KIND}, {NAD_KIND}, {MNP_KIND}, {ADMIN_KIND}, Namespace (its "
        "labels), CNI conf files (type or plugins) and the claims of a Pod (or a workload's pod "
        "template)"
    )
    if isinstance(doc.get("kind"), str) and doc["kind"]:
        report.skipped = f"not a kind cnidra judges ({validated})"
    else:
        issues.warn(
            ROOT / "kind",
            f"skipped: {validated}, not "
            + (describe(doc["kind"]) if "kind" in doc else "a document without kind"),
        )


def _validate_policy_side(doc: Mapping[str, Any], kind: str, issues: Issues) -> None:
    """Network policy's documents (docs/network-policy.md): a policy decoded, its errors at
    their paths; a Namespace is only read, for its labels (what namespace selectors see,
    cnidra.api.netpolicy_input)."""
    if kind == MNP_KIND:
        issues.extend(decode_policy(doc)[1].items)
    elif kind == ADMIN_KIND:
        issues.extend(decode_admin_policy(doc)[1].items)


def _validate_network(doc: Mapping[str, Any], issues: Issues) -> None:
    """A CNINetwork: its spec, and its config when it carries one."""
    found = cninetwork(doc, Unresolved("node conf", offline=True))
    if isinstance(found, Unresolved):
        if not found.offline:
            issues.error(ROOT / "spec", found.message)
        return
    validate_network_config(dict(found.config), found.path / "config", issues, complete=True)
    spec = doc.get("spec")
    prefix = (spec if isinstance(spec, dict) else {}).get("ifNamePrefix")
    if isinstance(prefix, str) and prefix_problem(prefix):
        issues.error(ROOT / "spec" / "ifNamePrefix", str(prefix_problem(prefix)))


def _validate_nad(doc: Mapping[str, Any], issues: Issues) -> None:
    """A Multus NetworkAttachmentDefinition: its `spec.config` is a CNI config as JSON text."""
    meta, spec = doc.get("metadata"), doc.get("spec")
    if not isinstance(meta, dict):
        issues.error(ROOT / "metadata", f"must be an object, got {describe(meta)}")
        return
    if spec is not None and not isinstance(spec, dict):
        issues.error(ROOT / "spec", f"must be an object, got {describe(spec)}")
        return
    raw = (spec or {}).get("config")
    path = ROOT / "spec" / "config"
    if raw is None:
        issues.warn(
            path,
            "is not set: the config lives in a file on each node (or the NAD names only a "
            "resource), so there is nothing here to check",
        )
        return
    if not isinstance(raw, str):
        issues.error(path, f"must be a string holding JSON, got {describe(raw)}")
        return
    try:
        config = load_json(raw, "the JSON text")
    except LoadError as exc:
        issues.error(path, str(exc))
        return
    if isinstance(config, dict) and "name" not in config and isinstance(meta.get("name"), str):
        config = {"name": meta["name"], **config}  # the multi-net spec injects the NAD's name
    validate_network_config(config, path, issues, complete=True)


def _validate_claim(
    doc: Mapping[str, Any],
    kind: str,
    issues: Issues,
    classes: Mapping[str, list[ConfigEntry]],
    labels: Mapping[str, str],
    catalog: NetworkCatalog,
    strict_classes: bool = False,
    *,
    shape: bool = False,
) -> list[ResolvedRequest]:
    """`shape`: the apiserver's own checks of the claim's shape too (offline: the webhook and
    prepare get claims the apiserver decoded and checked already)."""
    devices, dpath = devices_of({**doc, "kind": kind})
    if not isinstance(devices, dict):
        issues.error(dpath, "is required: the device requests and their config")
        return []
    requests = read_requests(devices, dpath, issues, doc.get("apiVersion") if shape else None)
    own = claim_entries(devices, dpath, issues, {r.name for r in requests})
    out: list[ResolvedRequest] = []
    meta = doc.get("metadata")
    namespace = str((meta.get("namespace") if isinstance(meta, dict) else None) or "default")
    for req in requests:
        known = (req.device_class or "") in classes
        mine = bool(applicable(own, req.name))
        if strict_classes and not known and (mine or _looks_ours(req.device_class)):
            # a near name among a few classes (a hint's cost grows with the classes given)
            few = list(classes) if len(classes) <= MAX_HINTED else []
            close = difflib.get_close_matches(str(req.device_class), few, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            issues.error(
                req.fields / "deviceClassName",
                f"DeviceClass {describe(req.device_class)} is not among the classes given "
                f"({listing(sorted(classes))}){hint}",
            )
            continue
        if not known and not mine:
            continue  # another driver's request
        if mine or known:
            _check_count(req, issues)
        from_class = classes.get(req.device_class or "", [])
        resolved = check_request(
            [*from_class, *own],
            req.name,
            namespace,
            labels,
            issues,
            req.path,
            class_known=known,
            catalog=catalog,
        )
        if resolved is not None:
            resolved.judged = [*from_class, *own]
            resolved.where = req.path
            resolved.class_known = known
            out.append(resolved)
    # a config naming no request of the claim still has its own problems told (a request
    # `main/sub` takes the configs naming it or `main`)
    named = {r.name for r in requests} | {r.name.split("/", 1)[0] for r in requests}
    for entry in own:
        if entry.requests and named.isdisjoint(entry.requests):
            _check_alone(entry, issues)
    for resolved in out:
        resolved.slot = request_slot(resolved, f"request {resolved.request!r}")
    try:
        names = assign_names([r.slot for r in out if r.slot is not None])
    except NamingError as exc:
        for index, message in exc.problems:
            resolved = out[index]
            path = provenance(resolved.entries, "ifName") or dpath / "requests"
            issues.error(path, message)
        return out
    for resolved, name in zip(out, names, strict=True):
        resolved.config = resolved.config.model_copy(update={"if_name": name})
    return out


def _check_alone(entry: ConfigEntry, issues: Issues) -> None:
    """A config that applies to no request: its network checked on its own, so a wrong request
    name does not hide the rest (the class's policy is unknown without a request)."""
    config = entry.parameters.get("config")
    if isinstance(config, str):
        try:
            config = load_json(config, "config")
        except LoadError as exc:
            issues.error(entry.path / "config", str(exc))
            return
    if isinstance(config, dict):
        validate_network_config(config, entry.path / "config", issues, complete=True)


def _check_count(req: Request, issues: Issues) -> None:
    """Prepare gives one interface per request (one CNIConfig names one interface)."""
    if req.mode not in (None, "ExactCount"):
        issues.error(
            req.fields / "allocationMode",
            f"{describe(req.mode)}: a cnidra request is one interface; allowed: ExactCount "
            "with count 1 (a request per interface)",
        )
    elif req.count not in (None, 1):
        issues.error(
            req.fields / "count",
            f"{describe(req.count)}: a cnidra request is one interface, so prepare refuses "
            "more than one device; use count 1 (the default) and a request per interface",
        )


def _looks_ours(device_class: Any) -> bool:
    """A class name that is cnidra's or a near miss of one (cni.networking.k8s.io)."""
    text = str(device_class or "")
    return "cni" in text and "networking" in text


def _ours(doc: Mapping[str, Any], classes: Mapping[str, list[ConfigEntry]]) -> bool:
    """Whether a claim has anything of cnidra's: a config of its driver (its name anywhere in
    the claim) or a known class (a string of the claim that is one's name); one walk."""
    stack: list[Any] = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and (DRIVER_NAME in item or item in classes):
            return True
    return False


def request_slot(resolved: ResolvedRequest, owner: str) -> Slot:
    """How a resolved request's interface is named (cnidra.api.naming)."""
    return Slot(owner, resolved.config.if_name, resolved.config.if_name_prefix)
