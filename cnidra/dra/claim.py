"""An allocated ResourceClaim, read once into a typed view: what prepare needs of it and
nothing else, so no code below walks dictionary chains over the claim. Pure: no I/O.

The apiserver has validated the object's shape, but a claim is tenant input and an old or
foreign apiserver may hand anything: a field of the wrong type is a PrepareError naming it,
never an AttributeError."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cnidra.api.claimspec import (
    configs_for,
    decode_configs,
    is_dns_label,
    request_classes,
    request_order,
)
from cnidra.api.constants import DRIVER_NAME, POD_CLAIM_NAME_ANNOTATION
from cnidra.api.errors import SpecError
from cnidra.api.issues import FieldPath, Issues, describe
from cnidra.api.merge import ConfigEntry, Source
from cnidra.api.parameters import read_parameters

ALLOCATION_CONFIG = FieldPath(("status", "allocation", "devices", "config"))
RESULTS = FieldPath(("status", "allocation", "devices", "results"))
SPEC_DEVICES = FieldPath(("spec", "devices"))


class ClaimShapeError(SpecError):
    """A claim whose fields cnidra reads are not of the shape the API defines."""

    def __init__(self, message: str) -> None:
        ValueError.__init__(self, message)
        self.path, self.message = None, message


@dataclass(frozen=True)
class Result:
    """One device the scheduler allocated to one of the claim's requests."""

    request: str
    driver: str
    pool: str
    device: str
    share_id: str | None = None
    # what the allocation granted of the device's consumable capacities (capacity name ->
    # quantity as the apiserver wrote it, e.g. {"bandwidth": "1G"}); empty: nothing
    consumed_capacity: Mapping[str, str | int] = field(default_factory=dict)


@dataclass(frozen=True)
class Reserved:
    """A consumer the claim is reserved for (pods only matter to cnidra)."""

    uid: str
    name: str
    is_pod: bool


@dataclass(frozen=True)
class AllocatedClaim:
    uid: str
    generation: int
    request_order: Mapping[str, int]
    node_selector: Mapping[str, Any] | None
    allocated: bool
    results: tuple[Result, ...]
    configs: tuple[ConfigEntry, ...]  # our driver's opaque configs, read once
    reserved_for: tuple[Reserved, ...]
    pod_claim_name: str | None  # the pod's claim name, only when Kubernetes' own form
    # request (or `request/subrequest`) -> the DeviceClass it asks for: the network a policy
    # names as `deviceclass:<name>` (docs/network-policy.md)
    request_classes: Mapping[str, str] = field(default_factory=dict)

    @property
    def ours(self) -> tuple[Result, ...]:
        return tuple(r for r in self.results if r.driver == DRIVER_NAME)

    @property
    def pod_uids(self) -> tuple[str, ...]:
        return tuple(r.uid for r in self.reserved_for if r.is_pod and r.uid)

    @property
    def pod_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.reserved_for if r.is_pod and r.name)

    def selects_namespaces(self) -> bool:
        """Whether a CNIPolicy in the allocation selects namespaces by label."""
        return any(e.parameters.get("namespaceSelector") is not None for e in self.configs)


# `where` is a str or a FieldPath: made into text only for the error, not for every field read
def _obj(value: Any, where: object) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ClaimShapeError(f"{where} must be an object, got {describe(value)}")
    return value


def _list(value: Any, where: object) -> Sequence[Any]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ClaimShapeError(f"{where} must be a list, got {describe(value)}")
    return value


def _str(value: Any, where: object, default: str = "") -> str:
    if value is None:
        return default
    if not isinstance(value, str):
        raise ClaimShapeError(f"{where} must be a string, got {describe(value)}")
    return value


def _name(value: Any, where: object) -> str:
    """A short name many claims repeat (request, driver, pool, device): one copy held for all
    of them, not one per prepared claim (sys.intern; its table forgets unused ones)."""
    text = _str(value, where)
    return sys.intern(text) if len(text) <= 253 else text


def _capacities(value: Any, where: FieldPath) -> Mapping[str, str | int]:
    """A result's `consumedCapacity`: capacity name -> quantity (a string, or an integer as a
    foreign client may write it); checked as a quantity where it is used (cnidra.api.bandwidth)."""
    where = where / "consumedCapacity"
    raw = _obj(value, where)
    out: dict[str, str | int] = {}
    for name, quantity in raw.items():
        if not isinstance(name, str) or isinstance(quantity, bool):
            raise ClaimShapeError(
                f"{where / str(name)} must be a quantity, got {describe(quantity)}"
            )
        if not isinstance(quantity, str | int):
            raise ClaimShapeError(f"{where / name} must be a quantity, got {describe(quantity)}")
        out[sys.intern(name)] = quantity
    return out


def read_claim(claim: Any) -> AllocatedClaim:
    """The typed view; ClaimShapeError names the first field that is not what the API says."""
    claim = _obj(claim, "the claim")
    meta = _obj(claim.get("metadata"), "metadata")
    spec = _obj(claim.get("spec"), "spec")
    status = _obj(claim.get("status"), "status")
    allocation_raw = status.get("allocation")
    allocation = _obj(allocation_raw, "status.allocation")
    devices = _obj(allocation.get("devices"), "status.allocation.devices")
    try:  # the one reader of a claim's spec (cnidra.api.claimspec)
        spec_devices = _obj(spec.get("devices"), "spec.devices")
        order = request_order(spec_devices, SPEC_DEVICES)
    except SpecError as exc:
        raise ClaimShapeError(str(exc)) from exc
    classes = request_classes(spec_devices, SPEC_DEVICES)  # what a policy's network may be
    results = []
    for i, raw in enumerate(_list(devices.get("results"), "status.allocation.devices.results")):
        where = RESULTS / i
        item = _obj(raw, where)
        share = item.get("shareID")
        results.append(
            Result(
                request=_name(item.get("request"), where / "request"),
                driver=_name(item.get("driver"), where / "driver"),
                pool=_name(item.get("pool"), where / "pool"),
                device=_name(item.get("device"), where / "device"),
                share_id=_str(share, where / "shareID") if share is not None else None,
                consumed_capacity=_capacities(item.get("consumedCapacity"), where),
            )
        )
    reserved = []
    for i, raw in enumerate(_list(status.get("reservedFor"), "status.reservedFor")):
        item = _obj(raw, f"status.reservedFor[{i}]")
        reserved.append(
            Reserved(
                uid=_str(item.get("uid"), f"status.reservedFor[{i}].uid"),
                name=_str(item.get("name"), f"status.reservedFor[{i}].name"),
                is_pod=item.get("resource") == "pods" and not item.get("apiGroup"),
            )
        )
    annotations = _obj(meta.get("annotations"), "metadata.annotations")
    pod_claim_name = annotations.get(POD_CLAIM_NAME_ANNOTATION)
    generation = meta.get("generation") or 0
    selector = allocation.get("nodeSelector")
    return AllocatedClaim(
        uid=_str(meta.get("uid"), "metadata.uid"),
        generation=generation if isinstance(generation, int) else 0,
        request_order=order,
        node_selector=_obj(selector, "status.allocation.nodeSelector") if selector else None,
        allocated=bool(allocation_raw),
        results=tuple(results),
        configs=tuple(_config_entries(devices.get("config"))),
        reserved_for=tuple(reserved),
        # a path segment in the pod's containers (device metadata): only what Kubernetes can
        # set, a pod's claim name, never whatever a claim's author wrote into the annotation
        pod_claim_name=sys.intern(pod_claim_name) if is_dns_label(pod_claim_name) else None,
        request_classes=classes,
    )


def _config_entries(configs: object) -> list[ConfigEntry]:
    """Our driver's opaque configs of the allocation, read by the one reader of a claim's spec
    (cnidra.api.claimspec) and their parameters by the one reader of parameters (bounds, a
    JSON-string config parsed) that `cnidra validate` and the webhook use too."""
    try:
        read = decode_configs(configs, ALLOCATION_CONFIG)
    except SpecError as exc:
        raise ClaimShapeError(str(exc)) from exc
    entries = []
    for cfg in configs_for(DRIVER_NAME, read):
        path = cfg.parameters_path
        issues = Issues()
        params = read_parameters(cfg.parameters, path, issues)
        if issues.errors:
            raise ClaimShapeError("; ".join(str(e) for e in issues.errors))
        source = Source.CLASS if cfg.source == Source.CLASS else Source.CLAIM
        entries.append(
            ConfigEntry(
                source,
                params if isinstance(params, Mapping) else {},
                cfg.requests,
                path,
            )
        )
    return entries
