"""NodePrepareResources / NodeUnprepareResources: everything slow happens here.

`resolve_claim` is pure: an allocated ResourceClaim (as JSON) in, a PreparedClaim out, or a
PrepareError saying what a person should fix. DRA copied the DeviceClass configs into the
allocation (source FromClass), so no DeviceClass lookup is needed; each request becomes an
attachment through the one path `cnidra validate` and `cnidra try` use too
(`cnidra.cni.attach.resolve_attachment`)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from cnidra.api.constants import (
    DEFAULT_MAX_ATTACHMENTS,
    DRIVER_NAME,
    POD_CLAIM_NAME_ANNOTATION,
)
from cnidra.api.errors import UnusableObject
from cnidra.api.issues import FieldPath, Issues
from cnidra.api.merge import ConfigEntry, Source
from cnidra.api.nodes import NodeView, named_nodes, selects
from cnidra.api.ownership import PrivateDirs
from cnidra.api.refs import ObjectRef
from cnidra.api.validate import is_dns_label
from cnidra.cni.attach import Attachment, Device, resolve_attachment
from cnidra.state.checkpoint import Checkpoint, PreparedClaim
from cnidra.status.metadata import DeviceMetadata, base_request
from cnidra.util.locks import KeyedLocks

log = logging.getLogger(__name__)
ALLOCATION_CONFIG = FieldPath(("status", "allocation", "devices", "config"))


# What one opaque config may be: real CNIConfigs are a few KiB and a dozen levels deep.
MAX_PARAMETERS_DEPTH = 32
MAX_PARAMETERS_BYTES = 64 * 1024


def too_big(value: Any) -> str | None:
    """Why a config is refused before it is parsed any further (depth first, iteratively, so a
    config nested thousands of levels deep cannot exhaust the stack)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_PARAMETERS_DEPTH:
            return f"is nested more than {MAX_PARAMETERS_DEPTH} levels deep"
        if isinstance(item, Mapping):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    size = len(json.dumps(value, separators=(",", ":")))
    if size > MAX_PARAMETERS_BYTES:
        return f"is {size} bytes; at most {MAX_PARAMETERS_BYTES} are allowed"
    return None


class PrepareError(Exception):
    """A per-claim failure kubelet shows in the pod's events: it must say what to fix."""


class ClaimSource(Protocol):
    """A claim by name; UnusableObject for one that exists but cannot be read."""

    async def get(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...


class NamespaceLabels(Protocol):
    async def labels(self, namespace: str) -> Mapping[str, str] | None: ...


def resolve_claim(
    claim: Mapping[str, Any],
    ref: ObjectRef,
    node: str,
    dirs: PrivateDirs,
    view: NodeView,
    namespace_labels: Mapping[str, str] | None = None,
) -> PreparedClaim:
    meta = claim.get("metadata") or {}
    if meta.get("uid") != ref.uid:
        raise PrepareError(
            f"claim {ref} has UID {meta.get('uid')}, kubelet asked for {ref.uid}: "
            "it was deleted and created again; the pod must be recreated"
        )
    status = claim.get("status") or {}
    allocation = status.get("allocation")
    if not allocation:
        raise PrepareError(f"claim {ref} is not allocated")
    selector = allocation.get("nodeSelector")
    if not selects(selector, node, view.labels):
        nodes = ", ".join(sorted(named_nodes(selector))) or "other nodes"
        raise PrepareError(f"claim {ref} is allocated to {nodes}, not to this node {node}")
    devices = allocation.get("devices") or {}
    results = [r for r in devices.get("results") or [] if r.get("driver") == DRIVER_NAME]
    if not results:
        raise PrepareError(f"claim {ref} has no devices of driver {DRIVER_NAME}")
    entries = _config_entries(devices.get("config") or [])
    per_request: dict[str, int] = {}
    for result in results:
        per_request[result["request"]] = per_request.get(result["request"], 0) + 1
    problems: list[str] = []
    prepared: list[Attachment] = []
    if_names: dict[str, str] = {}
    for result in results:
        request = result["request"]
        if per_request[request] > 1:
            problems.append(
                f"request {request!r} was allocated {per_request[request]} devices, but "
                "one CNIConfig gives one interface name; use count 1 per request"
            )
            continue
        issues = Issues()
        link = view.links.get(result["device"])
        if link is None:
            problems.append(
                f"request {request!r} was allocated device {result['device']!r}, which is not "
                "a link of this node (any more); the pod must be scheduled again"
            )
            continue
        device = Device(result["pool"], result["device"], result.get("shareID"), link)
        attachment = resolve_attachment(
            entries,
            request,
            ref,
            device,
            dirs,
            issues,
            ALLOCATION_CONFIG,
            namespace_labels=namespace_labels,
        )
        if attachment is None:
            problems.append(_describe(request, entries, issues))
            continue
        if link in view.protected and not attachment.node_link_allowed:
            problems.append(
                f"request {request!r} was allocated link {link!r}, which carries the node itself "
                "(its default route or address); only a DeviceClass whose CNIPolicy lists it in "
                "nodeLinks may use it"
            )
            continue
        if attachment.if_name in if_names:
            problems.append(
                f"requests {if_names[attachment.if_name]!r} and {request!r} both use "
                f"ifName {attachment.if_name!r}"
            )
        if_names[attachment.if_name] = request
        prepared.append(attachment)
    if problems:
        raise PrepareError(f"claim {ref}: " + "; ".join(dict.fromkeys(problems)))
    pods = tuple(
        r["uid"]
        for r in status.get("reservedFor") or []
        if r.get("resource") == "pods" and not r.get("apiGroup") and r.get("uid")
    )
    # a path segment in the pod's containers (device metadata): only what Kubernetes can set,
    # a pod's claim name, never whatever a claim's author wrote into the annotation
    pod_claim_name = (meta.get("annotations") or {}).get(POD_CLAIM_NAME_ANNOTATION)
    return PreparedClaim(
        ref,
        pods,
        tuple(prepared),
        int(meta.get("generation") or 0),
        pod_claim_name if is_dns_label(pod_claim_name) else None,
    )


def _selects_namespaces(claim: Mapping[str, Any]) -> bool:
    """Whether a CNIPolicy in the allocation selects namespaces by label."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    for cfg in (allocation.get("devices") or {}).get("config") or []:
        params = (cfg.get("opaque") or {}).get("parameters")
        if isinstance(params, Mapping) and params.get("namespaceSelector") is not None:
            return True
    return False


def _describe(request: str, entries: Sequence[ConfigEntry], issues: Issues) -> str:
    chosen = [e for e in entries if e.applies_to(request)]
    if not chosen:
        return "; ".join(i.message for i in issues.errors)
    origin = "DeviceClass" if all(e.source is Source.CLASS for e in chosen) else "claim"
    details = "; ".join(f"{i.path}: {i.message}" for i in issues.errors) or "incomplete config"
    return f"request {request!r} ({origin} config) is invalid: {details}"


def _config_entries(configs: Sequence[Mapping[str, Any]]) -> list[ConfigEntry]:
    entries = []
    for i, cfg in enumerate(configs):
        opaque = cfg.get("opaque") or {}
        if opaque.get("driver") != DRIVER_NAME:
            continue
        problem = too_big(opaque.get("parameters"))
        if problem:
            raise PrepareError(f"{ALLOCATION_CONFIG / i}.opaque.parameters {problem}")
        source = Source.CLASS if cfg.get("source") == Source.CLASS else Source.CLAIM
        entries.append(
            ConfigEntry(
                source,
                opaque.get("parameters") or {},
                tuple(cfg.get("requests") or ()),
                ALLOCATION_CONFIG / i / "opaque" / "parameters",
            )
        )
    return entries


class Preparer:
    def __init__(
        self,
        node: str,
        claims: ClaimSource,
        checkpoint: Checkpoint,
        dirs: PrivateDirs,
        max_attachments: int = DEFAULT_MAX_ATTACHMENTS,
        view: Callable[[], NodeView] = NodeView,
        namespaces: NamespaceLabels | None = None,
        metadata: DeviceMetadata | None = None,
    ) -> None:
        self.node = node
        self.claims = claims
        self.checkpoint = checkpoint
        self.dirs = dirs
        self.max_attachments = max_attachments
        self.view = view
        self.namespaces = namespaces
        self.metadata = metadata
        self._locks = KeyedLocks()

    async def prepare(self, ref: ObjectRef) -> PreparedClaim:
        async with self._locks.hold(ref.uid):
            return await self._prepare(ref)

    async def _prepare(self, ref: ObjectRef) -> PreparedClaim:
        known = self.checkpoint.get(ref.uid)
        try:
            claim = await self.claims.get(ref.namespace, ref.name)
        except UnusableObject as exc:
            raise PrepareError(str(exc)) from None
        except Exception as exc:
            if known is not None:
                return known  # what was prepared stands while the apiserver cannot be asked
            raise PrepareError(
                f"claim {ref} was never prepared on this node and the apiserver "
                f"could not be asked: {exc}"
            ) from None
        if claim is None:
            if known is not None:
                return known
            raise PrepareError(f"claim {ref} not found")
        labels = None
        if self.namespaces and _selects_namespaces(claim):  # a GET only when a policy asks
            labels = await self.namespaces.labels(ref.namespace)
        view = self.view()
        prepared = resolve_claim(claim, ref, self.node, self.dirs, view, labels)
        self._check_pod_limit(prepared)
        if known != prepared:
            await self.checkpoint.put(prepared)
        if self.metadata is not None:
            await asyncio.to_thread(self.metadata.prepare, prepared, view.attributes)
        return prepared

    def cdi_device_ids(self, claim: PreparedClaim, request: str) -> list[str]:
        if self.metadata is None:
            return []
        return [self.metadata.cdi_id(claim.uid, base_request(request))]

    def _check_pod_limit(self, prepared: PreparedClaim) -> None:
        """Every attachment of a pod is ADDed inside one NRI hook, whose time is bounded."""
        for pod in prepared.pod_uids:
            others = sum(
                len(c.devices) for c in self.checkpoint.for_pod(pod) if c.uid != prepared.uid
            )
            total = others + len(prepared.devices)
            if total > self.max_attachments:
                raise PrepareError(
                    f"claim {prepared.ref}: pod {pod} would get {total} cnidra interfaces; "
                    f"at most {self.max_attachments} per pod are allowed "
                    "(the driver's --max-attachments-per-pod), because all of them are set up "
                    "within the runtime's hook timeout"
                )

    async def unprepare(self, ref: ObjectRef) -> None:
        async with self._locks.hold(ref.uid):
            if await self.checkpoint.remove(ref.uid):
                log.info("unprepared claim %s (%s)", ref, ref.uid)
            if self.metadata is not None:
                await asyncio.to_thread(self.metadata.remove, ref)
