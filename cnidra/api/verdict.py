"""The verdict on one request of a claim: its configs (the class's and the claim's, read by
cnidra.api.claimspec) judged against the class's CNIPolicy, merged and validated as complete
(`check_request`), the one verdict `cnidra validate`, the webhook and prepare give; within
`judged_once()` each distinct input is judged once. Pure."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, cast

from cnidra.api.claimspec import (
    read_configs,
)
from cnidra.api.cniconfig import parse_parameters
from cnidra.api.constants import (
    DRIVER_NAME,
)
from cnidra.api.issues import ROOT, FieldPath, Issue, Issues, listing
from cnidra.api.merge import ConfigEntry, Source, applicable, merge_parameters, provenance
from cnidra.api.naming import Slot
from cnidra.api.networks import (
    NamedNetwork,
    NetworkCatalog,
    expand_network,
)
from cnidra.api.parameters import read_parameters
from cnidra.api.policy import check_claim, is_policy, parse_policy
from cnidra.api.types import CNIConfig

_OLD_DRIVER_NAMES = ("cni.dra.networking.k8s.io", "poc.dra.networking")


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
