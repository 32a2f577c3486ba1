"""Validation of the documents users write: ResourceClaim, ResourceClaimTemplate, DeviceClass
and bare CNIConfig. Every problem is reported at once, each at a path from the document root."""

from __future__ import annotations

import difflib
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, cast

from pydantic import ValidationError

from cnidra.api.claimspec import (
    Request,
    devices_of,
    is_dns_label,
    read_configs,
    read_requests,
    read_spec,
)
from cnidra.api.constants import (
    API_GROUP,
    API_VERSION,
    DEFAULT_MAX_ATTACHMENTS,
    DEVICE_CLASS_NAME,
    DRIVER_NAME,
    KIND,
    LEGACY_KIND,
    RESOURCE_API_VERSIONS,
)
from cnidra.api.ipam import POOL_KIND, PoolError, cnidra_ipam, pool_from_object
from cnidra.api.issues import ROOT, FieldPath, Issue, Issues, describe, listing
from cnidra.api.loading import LoadError, load_json
from cnidra.api.merge import ConfigEntry, Source, applicable, merge_parameters, provenance
from cnidra.api.multus import NETWORKS_ANNOTATION
from cnidra.api.naming import NamingError, Slot, assign_names, prefix_problem
from cnidra.api.netconf import to_conflist, validate_network_config
from cnidra.api.networks import (
    NAD_KIND,
    NETWORK_KIND,
    NamedNetwork,
    NetworkCatalog,
    StaticCatalog,
    Unresolved,
    cninetwork,
    expand_network,
    nad,
)
from cnidra.api.parameters import read_parameters
from cnidra.api.plugin_schema import ifname_problem
from cnidra.api.policy import check_claim, is_policy, parse_policy
from cnidra.api.types import CNICONFIG_FIELDS, CNIConfig

KNOWN_CAPABILITIES = ("portMappings", "bandwidth", "ips", "mac", "dns", "infinibandGUID")
_OLD_DRIVER_NAMES = ("cni.dra.networking.k8s.io", "poc.dra.networking")
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


@dataclass
class ResolvedRequest:
    """A request's merged and validated configuration, ready for the CNI runtime."""

    request: str
    config: CNIConfig
    entries: list[ConfigEntry]
    network: NamedNetwork | None = None  # the named network the request references
    # how the interface is named, before the claim's names were assigned (for a pod's check)
    slot: Slot | None = None
    # every config the verdict read (the class's CNIPolicy among them), and where the request
    # is: what prepare's path (cnidra.dra.resolve.resolve_attachment) judges again
    judged: list[ConfigEntry] = field(default_factory=list)
    where: FieldPath = ROOT
    class_known: bool = False  # its DeviceClass was in the input: its CNIPolicy was judged


# ---------------------------------------------------------------- CNIConfig parameters


def parse_parameters(
    params: Any, path: FieldPath, issues: Issues, *, complete: bool, network: bool = True
) -> CNIConfig | None:
    """Check one CNIConfig object; None when it has errors. `network` False leaves its CNI
    config to a later check (a claim's, checked once merged with its class's)."""
    before = issues.error_count
    params = read_parameters(params, path, issues)
    if params is None:
        return None
    if not isinstance(params, dict):
        issues.error(path, f"must be a {KIND} object, got {describe(params)}")
        return None
    if params.get("kind") == LEGACY_KIND:
        issues.warn(path / "kind", f"kind {LEGACY_KIND!r} is deprecated; use {KIND!r}")
    try:
        model: CNIConfig | None = CNIConfig.model_validate(_without(params, "config"))
    except ValidationError as exc:
        _report_pydantic(exc, path, issues)
        model = None
    if "apiVersion" not in params:
        issues.error(path / "apiVersion", f"is required: {API_VERSION}")
    if "kind" not in params:
        issues.error(path / "kind", f"is required: {KIND}")
    if_name = params.get("ifName")
    if isinstance(if_name, str):
        problem = ifname_problem(if_name)
        if problem:
            issues.error(path / "ifName", f"{if_name!r} {problem}" if if_name else problem)
    prefix = params.get("ifNamePrefix")
    if isinstance(prefix, str):
        problem = prefix_problem(prefix)
        if problem:
            issues.error(path / "ifNamePrefix", problem)
    config = params.get("config")
    if config is not None and params.get("network") is not None:
        issues.error(
            path / "network",
            "a CNIConfig either embeds its network (config) or references one (network), not both",
        )
    if config is not None and network:
        validate_network_config(config, path / "config", issues, complete=complete)
    elif (
        complete
        and config is None
        and params.get("network") is None
        and not _has_error_at(issues, path / "config")
    ):
        issues.error(
            path / "config",
            "is required: a CNI network configuration (conf or conflist), or a named network "
            "in network",
        )
    if isinstance(config, dict):
        _cross_check(params, config, path, issues)
    if issues.error_count > before or model is None:
        return None
    if isinstance(config, dict):
        return model.model_copy(update={"config": config})
    return model


def _without(params: Mapping[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in params.items() if k != key}


def _has_error_at(issues: Issues, path: FieldPath) -> bool:
    return any(i.path == path for i in issues.errors)


def _cross_check(
    params: Mapping[str, Any], config: Mapping[str, Any], path: FieldPath, issues: Issues
) -> None:
    uses_pool = cnidra_ipam(to_conflist(config))
    if len(uses_pool) > 1:
        issues.error(
            path / "config",
            f"{len(uses_pool)} plugins ask for cnidra IPAM (ipam.type cnidra); one network gets "
            "one set of addresses, so one plugin may",
        )
    if uses_pool:
        _no_other_addresses(params, config, path, issues)
    if params.get("ipamClaimReference") and not uses_pool:
        issues.warn(
            path / "ipamClaimReference",
            "is ignored: only a network whose IPAM is cnidra's (ipam: {type: cnidra, pool: ...}, "
            "a CNIIPPool with allowPersistentIPs) keeps addresses in an IPAMClaim",
        )
    caps = params.get("capabilities")
    if isinstance(caps, dict) and caps:
        plugins = to_conflist(config).get("plugins")
        declared: set[str] = set()
        for plugin in plugins if isinstance(plugins, list) else []:
            pcaps = plugin.get("capabilities") if isinstance(plugin, dict) else None
            if isinstance(pcaps, dict):
                declared |= {k for k, v in pcaps.items() if v is True}
        for cap in caps:
            if cap in KNOWN_CAPABILITIES and cap not in declared:
                issues.error(
                    path / "capabilities" / cap,
                    f"is set but no plugin in config declares capabilities: {{{cap}: true}}, "
                    "so no plugin would receive it",
                )
        if isinstance(caps.get("ips"), list) and params.get("ipamClaimReference"):
            issues.error(
                path / "ipamClaimReference",
                "cannot be combined with capabilities.ips: the IPAMClaim decides the addresses",
            )


def _no_other_addresses(
    params: Mapping[str, Any], config: Mapping[str, Any], path: FieldPath, issues: Issues
) -> None:
    """cnidra IPAM's addresses are the pool's: prepare hands them to the static plugin, which
    would let CNI_ARGS IP, args.cni.ips or runtimeConfig ips replace them."""
    why = (
        "would replace the addresses cnidra IPAM gives from the pool (the static plugin reads "
        "it over its own); a network with cnidra IPAM takes its addresses from the pool only"
    )
    args = params.get("args")
    for key in ("IP", "GATEWAY"):
        if isinstance(args, Mapping) and key in args:
            issues.error(path / "args" / key, why)
    caps = params.get("capabilities")
    if isinstance(caps, Mapping) and "ips" in caps:
        issues.error(path / "capabilities" / "ips", why)
    plugins = config.get("plugins") if "plugins" in config else [config]
    for i, plugin in enumerate(plugins if isinstance(plugins, list) else []):
        pargs = plugin.get("args") if isinstance(plugin, Mapping) else None
        cni = pargs.get("cni") if isinstance(pargs, Mapping) else None
        if isinstance(cni, Mapping) and "ips" in cni:
            where = path / "config" / "plugins" / i if "plugins" in config else path / "config"
            issues.error(where / "args" / "cni" / "ips", why)


def _report_pydantic(exc: ValidationError, path: FieldPath, issues: Issues) -> None:
    for err in exc.errors():
        loc = path.join(err["loc"])
        kind, value = err["type"], err.get("input")
        if kind == "extra_forbidden":
            allowed = CNICONFIG_FIELDS if len(err["loc"]) == 1 else None
            hint = f"; allowed: {', '.join(allowed)}" if allowed else ""
            issues.error(loc, f"unknown field{hint}")
        elif kind == "literal_error" and err["loc"] == ("apiVersion",):
            issues.error(loc, f"must be {API_VERSION}, got {describe(value)}")
        elif kind == "literal_error" and err["loc"] == ("kind",):
            issues.error(loc, f"must be {KIND}, got {describe(value)}")
        elif kind == "missing":
            issues.error(loc, "is required")
        elif kind == "value_error":
            issues.error(loc, str(err["msg"]).removeprefix("Value error, "))
        else:
            issues.error(loc, f"{err['msg'][0].lower()}{err['msg'][1:]}, got {describe(value)}")


# ---------------------------------------------------------------- requests and merging


def check_request(
    entries: Sequence[ConfigEntry],
    request: str,
    namespace: str,
    labels: Mapping[str, str] | None,
    issues: Issues,
    where: FieldPath,
    *,
    class_known: bool = True,
    catalog: NetworkCatalog | None = None,
    device_network: NamedNetwork | None = None,
) -> ResolvedRequest | None:
    """What the claim asks, its named network (cnidra.api.networks) put in place, checked
    against its class's CNIPolicy (cnidra.api.policy), then merged and validated as complete.
    `class_known` False (offline, the DeviceClass not given) skips the policy with a warning."""
    before = issues.error_count
    expansion = expand_network(
        entries, request, namespace, labels, catalog, issues, where, device_network
    )
    if issues.error_count > before:
        return None
    entries = expansion.entries
    chosen = applicable(entries, request)
    if class_known:
        networks = [e for e in chosen if not is_policy(e.parameters)]
        _once(
            "policy",
            chosen,
            (namespace, None if labels is None else sorted(labels.items())),
            issues,
            lambda told: check_claim(chosen, merge_parameters(networks), namespace, labels, told),
        )
    elif any(e.source is Source.CLAIM for e in chosen):
        issues.warn(
            where,
            f"request {request!r}: its DeviceClass is not in the input, so what the class's "
            "CNIPolicy allows is not checked (give the class with --policy FILE)",
        )
    if expansion.skipped:
        return None
    resolved = resolve_request(entries, request, issues, where)
    if resolved is not None:
        resolved.network = expansion.network
    return resolved if issues.error_count == before else None


class _Judged:
    """What was judged within one `judged_once()` block."""

    def __init__(self) -> None:
        self.results: dict[tuple[str, bytes], tuple[Any, tuple[Issue, ...]]] = {}
        # the digest of each config's parameters by the object's identity, the object kept
        # with it (so no other object gets its id while the block lasts)
        self.digests: dict[int, tuple[Any, bytes]] = {}

    def digest(self, value: Any) -> bytes:
        known = self.digests.get(id(value))
        if known is None:
            known = (value, _digest(value))
            self.digests[id(value)] = known
        return known[1]


def _digest(value: Any) -> bytes:
    return hashlib.sha256(repr(value).encode("utf-8", "surrogatepass")).digest()


_JUDGED: ContextVar[_Judged | None] = ContextVar("cnidra_judged", default=None)
T = TypeVar("T")


@contextmanager
def judged_once() -> Iterator[None]:
    """Within it, the policy's judgement of a request's configs and the validation of their
    merge run once per distinct input: a claim whose requests (up to 32, each with up to 8
    subrequests) share one config costs one judgement of it, not one per request. Exact: the
    key is the digest of the input's whole text (`repr`, as `VerdictCache`'s), each config's
    computed once; the result and every issue reported are handed out again as reported. For
    one judgement (a set of documents, a claim): the inputs must not change while it lasts,
    and what it keeps lives as long as the block."""
    if _JUDGED.get() is not None:
        yield
        return
    token = _JUDGED.set(_Judged())
    try:
        yield
    finally:
        _JUDGED.reset(token)


def _once(
    kind: str,
    entries: Sequence[ConfigEntry],
    extra: Any,
    issues: Issues,
    judge: Callable[[Issues], T],
) -> T:
    """`judge(issues)`; within `judged_once()`, its result for the same input (`entries`, each
    config's source, path and parameters, and `extra`) is handed out again."""
    memo = _JUDGED.get()
    if memo is None:
        return judge(issues)
    judged = (extra, [(str(e.source), e.path.segments, memo.digest(e.parameters)) for e in entries])
    key = (kind, _digest(judged))
    found = memo.results.get(key)
    if found is None:
        told = Issues()
        found = (judge(told), tuple(told.items))
        memo.results[key] = found
    value, told_items = found
    issues.extend(told_items)
    return cast(T, value)


class VerdictCache:
    """`check_request`'s verdicts by the content of what it judged, for prepare: the pods of one
    template carry the same configs, and the decoding, the policy and the validator (most of a
    prepare's CPU after the claim's GET) then run once per distinct config, not once per pod.

    Exact, never a weaker check: the key is a digest of everything the verdict reads (the
    request, the namespace and its labels, the anchor path, and each config that applies to the
    request with its source, requests, path and parameters, in DRA order), over their `repr`,
    which for JSON data (all a claim holds) tells apart every two values Python and the plugins
    could read differently (a list from a tuple, 1 from 1.0 from True, key order); a config that
    differs in any byte is judged anew. What is cached is the verdict and every issue it
    reported, handed out again as reported. Named networks (a catalog, a network device) are
    read afresh at every prepare, so a request that references one is never cached.

    Bounded, whatever tenants write: at most `size` verdicts (least recently used dropped), and
    configs whose key text exceeds `max_key_chars` (real ones are a few KiB; a config may be
    64 KiB, cnidra.api.parameters) are judged every time, not kept. Safe to use from worker
    threads (prepare judges in them): the table is behind a lock, held only to look up and to
    keep, never while judging (two threads may judge one config at once; one verdict is kept)."""

    def __init__(self, size: int = 128, max_key_chars: int = 16 * 1024) -> None:
        self.size = size
        self.max_key_chars = max_key_chars
        self._verdicts: OrderedDict[bytes, tuple[ResolvedRequest | None, tuple[Issue, ...]]] = (
            OrderedDict()
        )
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._verdicts)

    def check_request(
        self,
        entries: Sequence[ConfigEntry],
        request: str,
        namespace: str,
        labels: Mapping[str, str] | None,
        issues: Issues,
        where: FieldPath,
        *,
        class_known: bool = True,
        catalog: NetworkCatalog | None = None,
        device_network: NamedNetwork | None = None,
    ) -> ResolvedRequest | None:
        key = None
        if catalog is None and device_network is None:
            key = self._key(entries, request, namespace, labels, where, class_known)
        found = None
        with self._lock:
            if key is not None:
                found = self._verdicts.get(key)
            if found is not None:
                self.hits += 1
                assert key is not None
                self._verdicts.move_to_end(key)
            else:
                self.misses += 1
        if found is None:
            told = Issues()
            resolved = check_request(
                entries,
                request,
                namespace,
                labels,
                told,
                where,
                class_known=class_known,
                catalog=catalog,
                device_network=device_network,
            )
            found = (resolved, tuple(told.items))
            if key is not None:
                with self._lock:
                    self._verdicts[key] = found
                    while len(self._verdicts) > self.size:
                        self._verdicts.popitem(last=False)
        resolved, told_items = found
        issues.extend(told_items)
        # a copy: callers set attributes of theirs (the request's interface name, its slot)
        return replace(resolved) if resolved is not None else None

    def _key(
        self,
        entries: Sequence[ConfigEntry],
        request: str,
        namespace: str,
        labels: Mapping[str, str] | None,
        where: FieldPath,
        class_known: bool,
    ) -> bytes | None:
        text = repr(
            (
                request,
                namespace,
                None if labels is None else sorted(labels.items()),
                where.segments,
                class_known,
                # the configs that apply to the request, in DRA order: all the verdict reads
                [
                    (str(e.source), e.requests, e.path.segments, e.parameters)
                    for e in applicable(entries, request)
                ],
            )
        )
        if len(text) > self.max_key_chars:
            return None
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def resolve_request(
    entries: Sequence[ConfigEntry], request: str, issues: Issues, where: FieldPath
) -> ResolvedRequest | None:
    """Merge the configs that apply to `request` and validate the result as complete."""
    chosen = [e for e in applicable(entries, request) if not is_policy(e.parameters)]
    if not chosen:
        return None
    merged = merge_parameters(chosen)
    anchor = chosen[-1].path
    if "config" not in merged:
        issues.error(
            where,
            f"request {request!r}: no config sets config (the CNI network configuration) "
            "or network (a named network)",
        )
        return None
    inner = Issues()
    model = _once(  # the merge of the configs, validated
        "network",
        chosen,
        None,
        inner,
        lambda told: parse_parameters(merged, ROOT, told, complete=True),
    )
    for issue in inner.items:  # an Omitted line keeps its count
        issues.add(replace(issue, path=_attribute(issue.path, chosen, anchor)))
    if model is None:
        return None
    return ResolvedRequest(request, model, list(chosen))


def _attribute(path: FieldPath, chosen: Sequence[ConfigEntry], anchor: FieldPath) -> FieldPath:
    """Map a path in the merged parameters back to the config that supplied the field."""
    if not path.segments:
        return anchor
    head = path.segments[0]
    origin = provenance(chosen, str(head))
    base = origin.segments[:-1] if origin else anchor.segments
    return FieldPath((*base, *path.segments))


def claim_entries(
    devices: Mapping[str, Any],
    base: FieldPath,
    issues: Issues,
    request_names: set[str],
    source: Source = Source.CLAIM,
) -> list[ConfigEntry]:
    """Our driver's configs of `devices` (a claim's or a DeviceClass's, at `base`), each read
    by the one reader (cnidra.api.claimspec) and judged."""
    parents = {n.split("/", 1)[0] for n in request_names}
    known = listing(sorted(request_names)) or "none"
    entries: list[ConfigEntry] = []
    for cfg in read_configs(devices.get("config"), base / "config", issues):
        cpath = cfg.path
        for j, name in enumerate(cfg.requests):
            if source is Source.CLAIM and name not in request_names and name not in parents:
                issues.error(
                    cpath / "requests" / j,
                    f"names request {name!r}, which spec.devices.requests does not define; "
                    f"known: {known}",
                )
        driver = cfg.driver
        if driver in _OLD_DRIVER_NAMES:
            issues.warn(
                cpath / "opaque" / "driver",
                f"{driver!r} is an old driver name; cnidra is {DRIVER_NAME!r}, "
                "so it ignores this config",
            )
        if driver != DRIVER_NAME:
            continue
        ppath = cfg.parameters_path
        # read once (bounds, a JSON-string config parsed): the policy and the validator judge
        # this form, and it is what reaches the plugins
        before = issues.error_count
        params = read_parameters(cfg.parameters, ppath, issues)
        if issues.error_count > before:
            continue
        if isinstance(params, dict) and is_policy(params):
            if source is Source.CLASS:
                parse_policy(params, ppath, issues)
                entries.append(ConfigEntry(source, params, cfg.requests, ppath))
            else:
                issues.error(ppath / "kind", "a CNIPolicy comes from a DeviceClass, not a claim")
            continue
        # a claim's network is validated once, merged with its class's, per request
        checked = parse_parameters(
            params, ppath, issues, complete=False, network=source is Source.CLASS
        )
        if checked is not None or isinstance(params, dict):
            entries.append(
                ConfigEntry(source, params if isinstance(params, dict) else {}, cfg.requests, ppath)
            )
    return entries


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
    return reports


POD_TEMPLATE_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job")


def _pod_spec(doc: Mapping[str, Any]) -> tuple[Any, FieldPath]:
    """A Pod's spec, or a workload's pod template spec, with its path."""
    if doc.get("kind") == "Pod":
        return doc.get("spec"), ROOT / "spec"
    template = (
        (doc.get("spec") or {}).get("template") if isinstance(doc.get("spec"), dict) else None
    )
    spec = template.get("spec") if isinstance(template, dict) else None
    return spec, ROOT / "spec" / "template" / "spec"


def _name_pods_interfaces(docs: Sequence[Any], reports: Sequence[DocumentReport]) -> None:
    """A pod's interfaces across all its claims, named as prepare names them: for each Pod (or
    workload) in the input, the claims and templates it lists that are also in the input."""
    claims: dict[tuple[str, str, str], DocumentReport] = {}
    for doc, report in zip(docs, reports, strict=True):
        if report.kind in ("ResourceClaim", "ResourceClaimTemplate") and report.name:
            claims[(report.kind, _namespace(doc), report.name)] = report
    for doc, report in zip(docs, reports, strict=True):
        if report.kind != "Pod" and report.kind not in POD_TEMPLATE_KINDS:
            continue
        spec, base = _pod_spec(doc)
        entries = spec.get("resourceClaims") if isinstance(spec, dict) else None
        if not isinstance(entries, list):
            continue
        slots: list[Slot] = []
        where: list[FieldPath] = []
        for i, entry in enumerate(entries):
            path = base / "resourceClaims" / i
            found = _claim_of(entry, _namespace(doc), claims)
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


def _namespace(doc: Any) -> str:
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    return str((meta.get("namespace") if isinstance(meta, dict) else None) or "default")


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
        _check_pod(doc, issues)
    elif "kind" not in doc and ("plugins" in doc or "type" in doc):
        # a CNI conf or conflist file as libcni reads it
        report.kind = "conflist" if "plugins" in doc else "conf"
        validate_network_config(doc, ROOT, issues, complete=True)
    else:
        issues.warn(
            ROOT / "kind",
            f"skipped: cnidra validates ResourceClaim, ResourceClaimTemplate, DeviceClass, "
            f"CNIConfig, {NETWORK_KIND}, {POOL_KIND}, {NAD_KIND}, CNI conf files (type or "
            "plugins) and the claims of a Pod (or a workload's pod template), not "
            + (describe(doc["kind"]) if "kind" in doc else "a document without kind"),
        )
    return report


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


# ---------------------------------------------------------------- what the cluster refuses


CLAIM_CONFIG_LABEL = f"{API_GROUP}/claim-config"
CLASSES_ANNOTATION = f"{API_GROUP}/device-classes"
MULTUS_ANNOTATIONS = (NETWORKS_ANNOTATION, "v1.multus-cni.io/default-network")


@dataclass(frozen=True)
class Admission:
    """The shipped ValidatingAdmissionPolicies' rules on claims (deploy/admission.yaml), judged
    offline with what is known of the claims' namespace: its labels and annotations (None when
    not given: then a warning says what the rule needs instead of a verdict)."""

    labels: Mapping[str, str] | None = None
    annotations: Mapping[str, str] | None = None

    def judge(self, doc: Mapping[str, Any], kind: str, issues: Issues) -> None:
        devices, dpath = devices_of({**doc, "kind": kind})
        spec = read_spec(devices, dpath, Issues()) if isinstance(devices, dict) else None
        ours = spec is not None and any(c.driver == DRIVER_NAME for c in spec.configs)
        namespace = _namespace(doc)
        if ours:
            self._claim_config(namespace, dpath / "config", issues)
        admin = sorted(
            {
                str(r.device_class)
                for r in (spec.requests if spec is not None else ())
                if str(r.device_class).endswith("." + DEVICE_CLASS_NAME)
            }
        )
        if not admin:
            return
        rule = (
            f"the shipped admission (ValidatingAdmissionPolicy device-classes.{API_GROUP}) "
            f"admits a cnidra admin class only in a namespace whose annotation "
            f"{CLASSES_ANNOTATION} lists it (an admin sets it: kubectl annotate namespace "
            f"{namespace} {CLASSES_ANNOTATION}={','.join(admin)})"
        )
        if self.annotations is None:
            issues.warn(
                dpath / "requests",
                f"DeviceClass(es) {', '.join(admin)}: {rule}; --namespace-annotation "
                f"{CLASSES_ANNOTATION}=... checks namespace {namespace}'s",
            )
            return
        # as the CEL rule reads it: split at commas, nothing trimmed
        listed = (self.annotations.get(CLASSES_ANNOTATION) or "").split(",")
        refused = [c for c in admin if c not in listed]
        if refused:
            issues.error(
                dpath / "requests",
                f"namespace {namespace} may not use DeviceClass(es) {', '.join(refused)}: "
                f"{rule}; --namespace-annotation does not list them",
            )

    def _claim_config(self, namespace: str, path: FieldPath, issues: Issues) -> None:
        label = f"{CLAIM_CONFIG_LABEL}=true"
        how = f"an admin sets it: kubectl label namespace {namespace} {label}"
        if self.labels is None:
            issues.warn(
                path,
                f"the shipped admission refuses {DRIVER_NAME} configs in the claims of a "
                f"namespace without the label {label} ({how}); --namespace-labels KEY=VALUE,... "
                f"checks namespace {namespace}'s labels",
            )
        elif self.labels.get(CLAIM_CONFIG_LABEL) != "true":
            issues.error(
                path,
                f"namespace {namespace} may not carry {DRIVER_NAME} configs in its claims: the "
                f"shipped admission (ValidatingAdmissionPolicy claim-config.{API_GROUP}) refuses "
                f"them without the label {label}, which --namespace-labels does not give; {how}",
            )


def _check_pod(doc: Mapping[str, Any], issues: Issues) -> None:
    """What a Pod (or a workload's pod template) has that the apiserver refuses or that cnidra
    does not read: a container's claim that names no pod claim, Multus' annotations."""
    _multus_annotations(doc.get("metadata"), ROOT / "metadata", issues)
    spec, base = _pod_spec(doc)
    if doc.get("kind") != "Pod":
        template = (
            doc.get("spec", {}).get("template") if isinstance(doc.get("spec"), dict) else None
        )
        if isinstance(template, dict):
            _multus_annotations(
                template.get("metadata"), ROOT / "spec" / "template" / "metadata", issues
            )
    if not isinstance(spec, dict):
        return
    entries = spec.get("resourceClaims")
    names: list[str] = []
    for i, entry in enumerate(entries if isinstance(entries, list) else []):
        name = entry.get("name") if isinstance(entry, dict) else None
        if not is_dns_label(name):
            issues.error(
                base / "resourceClaims" / i / "name",
                f"{describe(name)} must be a DNS label (lowercase letters, digits and '-')",
            )
            continue
        if name in names:
            issues.error(
                base / "resourceClaims" / i / "name",
                f"{name!r} is given twice; the apiserver refuses a pod whose claims share a name",
            )
        names.append(name)
        sources = [k for k in ("resourceClaimName", "resourceClaimTemplateName") if k in entry]
        if len(sources) != 1:
            issues.error(
                base / "resourceClaims" / i,
                "must set exactly one of resourceClaimName and resourceClaimTemplateName; it "
                f"sets {' and '.join(sources) or 'neither'}",
            )
    known = listing(names) or "none"
    for group in ("initContainers", "containers"):
        containers = spec.get(group)
        for i, container in enumerate(containers if isinstance(containers, list) else []):
            resources = container.get("resources") if isinstance(container, dict) else None
            claims = resources.get("claims") if isinstance(resources, dict) else None
            for j, claim in enumerate(claims if isinstance(claims, list) else []):
                name = claim.get("name") if isinstance(claim, dict) else None
                if name not in names:
                    issues.error(
                        base / group / i / "resources" / "claims" / j / "name",
                        f"{describe(name)} names no entry of the pod's resourceClaims "
                        f"(known: {known}); the apiserver refuses the pod",
                    )


def _multus_annotations(meta: Any, path: FieldPath, issues: Issues) -> None:
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    for key in MULTUS_ANNOTATIONS:
        if isinstance(annotations, dict) and key in annotations:
            issues.warn(
                path / "annotations" / key,
                "is Multus', and cnidra ignores it: a pod's cnidra interfaces come from its "
                "resourceClaims (without Multus nothing reads it); `cnidra convert FILE` turns "
                "it into claim templates and the pod's resourceClaims",
            )
