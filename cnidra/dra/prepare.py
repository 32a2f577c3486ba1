"""NodePrepareResources / NodeUnprepareResources: everything slow happens here.

`resolve_claim` is pure: an allocated ResourceClaim (as JSON) in, a PreparedClaim out, or a
PrepareError saying what a person should fix. DRA copied the DeviceClass configs into the
allocation (source FromClass), so no DeviceClass lookup is needed; they merge with the claim's
the foundation's way (cnidra.api.merge)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cnidra.api.constants import DRIVER_NAME
from cnidra.api.issues import FieldPath, Issues
from cnidra.api.merge import ConfigEntry, Source, applicable, merge_parameters
from cnidra.api.netconf import to_conflist
from cnidra.api.ownership import PrivateDirs, owned_network, owned_network_name
from cnidra.api.validate import parse_parameters
from cnidra.state.checkpoint import Checkpoint, PreparedClaim, PreparedDevice

log = logging.getLogger(__name__)
DEFAULT_MAX_ATTACHMENTS = 8


class PrepareError(Exception):
    """A per-claim failure kubelet shows in the pod's events: it must say what to fix."""


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class ClaimSource(Protocol):
    async def get(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...


def resolve_claim(
    claim: Mapping[str, Any], ref: ClaimRef, node: str, dirs: PrivateDirs
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
    nodes = _allocated_nodes(allocation)
    if nodes is not None and node not in nodes:
        raise PrepareError(
            f"claim {ref} is allocated to node(s) {', '.join(sorted(nodes))}, "
            f"not to this node {node}"
        )
    devices = allocation.get("devices") or {}
    results = [r for r in devices.get("results") or [] if r.get("driver") == DRIVER_NAME]
    if not results:
        raise PrepareError(f"claim {ref} has no devices of driver {DRIVER_NAME}")
    entries = _config_entries(devices.get("config") or [])
    per_request: dict[str, int] = {}
    for result in results:
        per_request[result["request"]] = per_request.get(result["request"], 0) + 1
    problems: list[str] = []
    prepared: list[PreparedDevice] = []
    if_names: dict[str, str] = {}
    for result in results:
        request = result["request"]
        if per_request[request] > 1:
            problems.append(
                f"request {request!r} was allocated {per_request[request]} devices, but "
                "one CNIConfig gives one interface name; use count 1 per request"
            )
            continue
        device, problem = _prepare_device(result, entries, ref.namespace, dirs)
        if problem:
            problems.append(problem)
            continue
        assert device is not None
        if device.if_name in if_names:
            problems.append(
                f"requests {if_names[device.if_name]!r} and {request!r} both use "
                f"ifName {device.if_name!r}"
            )
        if_names[device.if_name] = request
        prepared.append(device)
    if problems:
        raise PrepareError(f"claim {ref}: " + "; ".join(dict.fromkeys(problems)))
    pods = tuple(
        r["uid"]
        for r in status.get("reservedFor") or []
        if r.get("resource") == "pods" and not r.get("apiGroup") and r.get("uid")
    )
    return PreparedClaim(
        ref.uid, ref.namespace, ref.name, pods, tuple(prepared), int(meta.get("generation") or 0)
    )


def _allocated_nodes(allocation: Mapping[str, Any]) -> set[str] | None:
    selector = allocation.get("nodeSelector")
    if not selector:
        return None
    names: set[str] = set()
    for term in selector.get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("operator") == "In":
                names.update(field.get("values") or [])
    return names or None


def _config_entries(configs: Sequence[Mapping[str, Any]]) -> list[ConfigEntry]:
    entries = []
    for i, cfg in enumerate(configs):
        opaque = cfg.get("opaque") or {}
        if opaque.get("driver") != DRIVER_NAME:
            continue
        source = Source.CLASS if cfg.get("source") == Source.CLASS else Source.CLAIM
        path = FieldPath(("status", "allocation", "devices", "config", i, "opaque", "parameters"))
        entries.append(
            ConfigEntry(
                source, opaque.get("parameters") or {}, tuple(cfg.get("requests") or ()), path
            )
        )
    return entries


def _prepare_device(
    result: Mapping[str, Any], entries: Sequence[ConfigEntry], namespace: str, dirs: PrivateDirs
) -> tuple[PreparedDevice | None, str | None]:
    request = result["request"]
    chosen = applicable(entries, request)
    if not chosen:
        return None, (
            f"request {request!r} has no {DRIVER_NAME} config: add an opaque config "
            "with a CNIConfig (ifName and config) to the claim or its DeviceClass"
        )
    merged = merge_parameters(chosen)
    issues = Issues()
    model = parse_parameters(merged, FieldPath(), issues, complete=True)
    if model is None or model.config is None or model.if_name is None:
        origin = "DeviceClass" if all(e.source is Source.CLASS for e in chosen) else "claim"
        details = "; ".join(f"{i.path}: {i.message}" for i in issues.errors) or "incomplete config"
        return None, f"request {request!r} ({origin} config) is invalid: {details}"
    caps = model.capabilities.runtime_values() if model.capabilities else {}
    conflist = to_conflist(model.config)
    label = str(conflist["name"])
    # a network the claim defines or changes is the tenant's; one wholly from the class is shared
    tenant = any(e.source is Source.CLAIM and "config" in e.parameters for e in chosen)
    name = owned_network_name(label, namespace if tenant else None)
    return PreparedDevice(
        request=request,
        pool=result["pool"],
        device=result["device"],
        if_name=model.if_name,
        network=owned_network(conflist, name, dirs),
        capability_args=caps,
        cni_args=tuple(sorted((model.args or {}).items())),
        share_id=result.get("shareID"),
        network_label=label,
    ), None


class Preparer:
    def __init__(
        self,
        node: str,
        claims: ClaimSource,
        checkpoint: Checkpoint,
        dirs: PrivateDirs,
        max_attachments: int = DEFAULT_MAX_ATTACHMENTS,
    ) -> None:
        self.node = node
        self.claims = claims
        self.checkpoint = checkpoint
        self.dirs = dirs
        self.max_attachments = max_attachments
        self._locks: dict[str, asyncio.Lock] = {}

    async def prepare(self, ref: ClaimRef) -> PreparedClaim:
        async with self._locks.setdefault(ref.uid, asyncio.Lock()):
            known = self.checkpoint.get(ref.uid)
            try:
                claim = await self.claims.get(ref.namespace, ref.name)
            except Exception as exc:
                if known is not None:
                    return known
                raise PrepareError(
                    f"claim {ref} is not cached on this node and the apiserver "
                    f"could not be asked: {exc}"
                ) from None
            if claim is None:
                if known is not None:
                    return known  # apiserver unreachable or claim gone: what we prepared stands
                raise PrepareError(f"claim {ref} not found")
            prepared = resolve_claim(claim, ref, self.node, self.dirs)
            self._check_pod_limit(prepared)
            if known != prepared:
                self.checkpoint.put(prepared)
            return prepared

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

    async def unprepare(self, ref: ClaimRef) -> None:
        async with self._locks.setdefault(ref.uid, asyncio.Lock()):
            if self.checkpoint.remove(ref.uid):
                log.info("unprepared claim %s (%s)", ref, ref.uid)
        self._locks.pop(ref.uid, None)
