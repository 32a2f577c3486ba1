"""The one reader of a ResourceClaim's device spec (the v1 shape, v1beta1's flat requests
read too): its requests, `exactly` or the `firstAvailable` subrequests, and its config entries
(`opaque.driver`, `opaque.parameters`, the `requests` a config applies to). `cnidra validate`,
the admission webhook and prepare read a claim through it and judge what it returns. Pure: no
I/O.

Two ways to read: into an `Issues` (every problem told, the readable rest returned: what a
linter and the webhook want), or `decode_*` (the first problem raised as a `SpecError` naming
the field and what is allowed: what prepare wants)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard, TypeVar

from cnidra.api.errors import SpecError
from cnidra.api.issues import ROOT, FieldPath, Issues, describe

# DRA's bounds on a claim (k8s.io/api/resource/v1: DeviceRequestsMaxSize, DeviceConfigMaxSize,
# FirstAvailableDeviceRequestMaxSize); the apiserver refuses more, so does cnidra validate, and
# what is judged stays within them whatever a file holds
MAX_REQUESTS = 32
MAX_CONFIGS = 32
MAX_SUBREQUESTS = 8

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def is_dns_label(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and len(value) <= 63 and bool(_DNS_LABEL.match(value))


# The fields of a device request by DRA API version, as the apiserver's strict decoding knows
# them (k8s.io/api/resource/...): v1beta1 puts a request's fields on it; v1beta2 and v1 under
# `exactly` (or alternatives in `firstAvailable`)
EXACT_FIELDS = (
    "deviceClassName", "selectors", "allocationMode", "count", "adminAccess", "tolerations",
    "capacity",
)  # fmt: skip
SUB_FIELDS = (
    "name", "deviceClassName", "selectors", "allocationMode", "count", "tolerations", "capacity",
)  # fmt: skip
REQUEST_FIELDS = {
    "resource.k8s.io/v1": ("name", "exactly", "firstAvailable"),
    "resource.k8s.io/v1beta2": ("name", "exactly", "firstAvailable"),
    "resource.k8s.io/v1beta1": ("name", *EXACT_FIELDS, "firstAvailable"),
}
DEVICES_FIELDS = ("requests", "constraints", "config")


@dataclass(frozen=True)
class Request:
    """One request a device is allocated for: a request with `exactly` (or v1beta1's flat
    fields), or one subrequest `main/sub` of a `firstAvailable` list. `count` and `mode` are as
    written (the judge says which it accepts); `device_class` is a string or absent."""

    name: str
    device_class: str | None
    path: FieldPath
    count: object = 1
    mode: object = "ExactCount"
    spec_path: FieldPath | None = None  # where count and deviceClassName are (exactly's)
    # the CEL expressions of its selectors, as written (those that are strings)
    selectors: tuple[str, ...] = ()

    @property
    def fields(self) -> FieldPath:
        return self.spec_path if self.spec_path is not None else self.path

    @property
    def parent(self) -> str:
        return self.name.split("/", 1)[0]


@dataclass(frozen=True)
class ConfigSpec:
    """One entry of a claim's (or a DeviceClass's, or an allocation's) `config` list: the
    requests it applies to (empty: all), the opaque driver it is for and its parameters as
    written (each driver reads its own), and `source` when an allocation says it."""

    path: FieldPath
    requests: tuple[str, ...] = ()
    driver: str | None = None  # None: no opaque config (or a driver name that is not a string)
    parameters: object = None
    source: str | None = None

    @property
    def parameters_path(self) -> FieldPath:
        return self.path / "opaque" / "parameters"


@dataclass(frozen=True)
class ClaimSpec:
    requests: tuple[Request, ...]
    configs: tuple[ConfigSpec, ...]

    @property
    def request_names(self) -> set[str]:
        return {r.name for r in self.requests}

    @property
    def device_classes(self) -> set[str]:
        return {r.device_class for r in self.requests if r.device_class is not None}

    def to_devices(self) -> dict[str, Any]:
        """The v1 `spec.devices` this spec reads from (requests in order, subrequests under
        their parent's `firstAvailable`)."""
        requests: list[dict[str, Any]] = []
        parents: dict[str, list[dict[str, Any]]] = {}
        for r in self.requests:
            fields: dict[str, Any] = {}
            if r.device_class is not None:
                fields["deviceClassName"] = r.device_class
            fields["allocationMode"], fields["count"] = r.mode, r.count
            if "/" in r.name:
                parent, sub = r.name.split("/", 1)
                if parent not in parents:
                    parents[parent] = []
                    requests.append({"name": parent, "firstAvailable": parents[parent]})
                parents[parent].append({"name": sub, **fields})
            else:
                requests.append({"name": r.name, "exactly": fields})
        configs: list[dict[str, Any]] = []
        for c in self.configs:
            entry: dict[str, Any] = {"requests": list(c.requests)}
            if c.driver is not None:
                entry["opaque"] = {"driver": c.driver, "parameters": c.parameters}
            if c.source is not None:
                entry["source"] = c.source
            configs.append(entry)
        return {"requests": requests, "config": configs}


# ---------------------------------------------------------------- where the spec is


def devices_of(doc: Mapping[str, Any]) -> tuple[object, FieldPath]:
    """A ResourceClaim's `spec.devices` (a ResourceClaimTemplate's `spec.spec.devices`), as
    written, with its path."""
    spec: Any = doc.get("spec")
    base = ROOT / "spec"
    if doc.get("kind") == "ResourceClaimTemplate":
        spec = spec.get("spec") if isinstance(spec, Mapping) else None
        base = base / "spec"
    return (spec.get("devices") if isinstance(spec, Mapping) else None), base / "devices"


# ---------------------------------------------------------------- requests


def within_dra_bound(
    items: list[Any], limit: int, what: str, path: FieldPath, issues: Issues
) -> list[Any]:
    """The first `limit` items, and an error when there are more (the apiserver refuses them)."""
    if len(items) > limit:
        issues.error(
            path,
            f"has {len(items):,} {what}; DRA allows at most {limit} (the apiserver refuses "
            "more); the rest are not checked",
        )
    return items[:limit]


def unknown_fields(
    obj: Mapping[str, Any], allowed: Sequence[str], path: FieldPath, issues: Issues, what: str
) -> None:
    """The apiserver refuses a field its schema does not have (kubectl's strict decoding)."""
    for key in obj:
        if key in allowed:
            continue
        close = difflib.get_close_matches(str(key), allowed, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        issues.error(
            path / str(key),
            f"is not a field of {what}, so the apiserver refuses it{hint} (allowed: "
            f"{', '.join(allowed)})",
        )


def _check_request_shape(
    req: Mapping[str, Any], rpath: FieldPath, api_version: object, issues: Issues
) -> None:
    """A request in the shape its API version has (the apiserver refuses another); nothing
    for a version not given (None) or not DRA's."""
    allowed = REQUEST_FIELDS.get(str(api_version))
    if allowed is None:
        return  # not a DRA version: told at apiVersion
    if "exactly" in allowed:
        flat = [k for k in req if k in EXACT_FIELDS]
        for key in flat:
            issues.error(
                rpath / key,
                f"belongs under exactly in {api_version} (v1beta1 put it on the request); "
                f"the apiserver refuses it here: write exactly: {{{key}: ...}}",
            )
        unknown_fields(
            {k: v for k, v in req.items() if k not in flat},
            allowed,
            rpath,
            issues,
            f"a {api_version} device request",
        )
        has = [k for k in ("exactly", "firstAvailable") if k in req]
        if len(has) != 1 and not flat:
            issues.error(
                rpath,
                "must set exactly one of exactly (one device of a class) or firstAvailable "
                f"(alternatives); it sets {' and '.join(has) or 'neither'}",
            )
        exactly = req.get("exactly")
        if isinstance(exactly, dict):
            unknown_fields(exactly, EXACT_FIELDS, rpath / "exactly", issues, "a request's exactly")
    else:
        unknown_fields(req, allowed, rpath, issues, f"a {api_version} device request")
    subs = req.get("firstAvailable")
    for j, sub in enumerate(subs if isinstance(subs, list) else []):
        if isinstance(sub, dict):
            unknown_fields(sub, SUB_FIELDS, rpath / "firstAvailable" / j, issues, "a subrequest")


def _device_class(fields: Mapping[str, Any], path: FieldPath, issues: Issues) -> str | None:
    value = fields.get("deviceClassName")
    if value is None or isinstance(value, str):
        return value
    issues.error(path / "deviceClassName", f"must be a DeviceClass's name, got {describe(value)}")
    return None


def read_requests(
    devices: Mapping[str, Any],
    base: FieldPath,
    issues: Issues,
    api_version: object = None,
    *,
    bounded: bool = True,
) -> list[Request]:
    """The requests of `devices` (a claim's `spec.devices`, at `base`), subrequests flattened
    to `main/sub`; `api_version`: the apiserver's own shape checks for that DRA version too.
    `bounded`: only the first of them DRA allows (an error says so); unbounded, all of them
    (the webhook counts what a claim would make it look up)."""
    if api_version in REQUEST_FIELDS:
        unknown_fields(devices, DEVICES_FIELDS, base, issues, "a claim's devices")
    raw = devices.get("requests")
    if not isinstance(raw, list) or not raw:
        issues.error(base / "requests", "must list at least one device request")
        return []
    if bounded:
        raw = within_dra_bound(raw, MAX_REQUESTS, "requests", base / "requests", issues)
    out: list[Request] = []
    for i, req in enumerate(raw):
        rpath = base / "requests" / i
        if not isinstance(req, dict):
            issues.error(rpath, f"must be an object with a name, got {describe(req)}")
            continue
        _check_request_shape(req, rpath, api_version, issues)
        name = req.get("name")
        if not is_dns_label(name):
            issues.error(
                rpath / "name",
                f"{describe(name)} must be a DNS label (lowercase letters, "
                "digits and '-', at most 63 characters)",
            )
            continue
        alternatives = req.get("firstAvailable")
        if isinstance(alternatives, list):
            if bounded:
                alternatives = within_dra_bound(
                    alternatives, MAX_SUBREQUESTS, "subrequests", rpath / "firstAvailable", issues
                )
            for j, sub in enumerate(alternatives):
                spath = rpath / "firstAvailable" / j
                if isinstance(sub, dict) and isinstance(sub.get("name"), str):
                    out.append(
                        Request(
                            f"{name}/{sub['name']}",
                            _device_class(sub, spath, issues),
                            spath,
                            sub.get("count", 1),
                            sub.get("allocationMode", "ExactCount"),
                            selectors=_expressions(sub),
                        )
                    )
        else:
            nested = isinstance(req.get("exactly"), dict)
            exactly: dict[str, Any] = req["exactly"] if nested else req
            where = rpath / "exactly" if nested else rpath
            out.append(
                Request(
                    name,
                    _device_class(exactly, where, issues),
                    rpath,
                    exactly.get("count", 1),
                    exactly.get("allocationMode", "ExactCount"),
                    where,
                    _expressions(exactly),
                )
            )
    return out


def _expressions(fields: Mapping[str, Any]) -> tuple[str, ...]:
    """The CEL expressions of a request's (or subrequest's) selectors that are strings."""
    selectors = fields.get("selectors")
    out = []
    for selector in selectors if isinstance(selectors, list) else []:
        cel = selector.get("cel") if isinstance(selector, Mapping) else None
        expression = cel.get("expression") if isinstance(cel, Mapping) else None
        if isinstance(expression, str):
            out.append(expression)
    return tuple(out)


def request_order(devices: Mapping[str, Any], base: FieldPath) -> dict[str, int]:
    """Each top-level request's name -> its index (the first, when a name repeats): how an
    allocation's results are ordered. Raises SpecError for a request that is not an object."""
    order: dict[str, int] = {}
    raw = devices.get("requests")
    if raw is None:
        return order
    if not isinstance(raw, list):
        raise SpecError(base / "requests", f"must be a list, got {describe(raw)}")
    for i, req in enumerate(raw):
        if not isinstance(req, Mapping):
            raise SpecError(base / "requests" / i, f"must be an object, got {describe(req)}")
        order.setdefault(str(req.get("name")), i)
    return order


def request_classes(devices: Mapping[str, Any], base: FieldPath) -> dict[str, str]:
    """The DeviceClass each request asks for (`exactly`, or v1beta1's field on the request), and
    each `firstAvailable` subrequest's as `request/subrequest`, read by `read_requests` (all of
    them, not only DRA's bound). Lenient: a request or class that is not of the API's shape is
    left out (the claim's shape is the apiserver's to check)."""
    found = read_requests(devices, base, Issues(), bounded=False)
    return {r.name: r.device_class for r in found if r.device_class is not None}


# ---------------------------------------------------------------- config entries


def read_configs(raw: object, path: FieldPath, issues: Issues) -> list[ConfigSpec]:
    """The entries of a `config` list at `path` (absent: none)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        issues.error(path, f"must be a list, got {describe(raw)}")
        return []
    out: list[ConfigSpec] = []
    for i, cfg in enumerate(within_dra_bound(raw, MAX_CONFIGS, "configs", path, issues)):
        cpath = path / i
        if not isinstance(cfg, dict):
            issues.error(cpath, f"must be an object, got {describe(cfg)}")
            continue
        requests = cfg.get("requests") or []
        if not isinstance(requests, list) or not all(isinstance(r, str) for r in requests):
            issues.error(
                cpath / "requests", f"must be a list of request names, got {describe(requests)}"
            )
            requests = []
        opaque = cfg.get("opaque")
        if opaque is not None and not isinstance(opaque, dict):
            issues.error(cpath / "opaque", f"must be an object, got {describe(opaque)}")
            continue
        driver = opaque.get("driver") if isinstance(opaque, dict) else None
        source = cfg.get("source")
        out.append(
            ConfigSpec(
                cpath,
                tuple(requests),
                driver if isinstance(driver, str) else None,
                opaque.get("parameters") if isinstance(opaque, dict) else None,
                source if isinstance(source, str) else None,
            )
        )
    return out


def configs_for(driver: str, configs: Iterable[ConfigSpec]) -> list[ConfigSpec]:
    return [c for c in configs if c.driver == driver]


# ---------------------------------------------------------------- strict reading

T = TypeVar("T")


def strictly(read: Callable[[Issues], T]) -> T:
    """`read` into an Issues; its first error raised as a SpecError."""
    issues = Issues()
    out = read(issues)
    if issues.errors:
        first = issues.errors[0]
        raise SpecError(first.path, first.message)
    return out


def read_spec(
    devices: object,
    base: FieldPath,
    issues: Issues,
    api_version: object = None,
    *,
    bounded: bool = True,
) -> ClaimSpec:
    """A claim's `spec.devices` (at `base`) read whole: its requests and its config entries."""
    if not isinstance(devices, Mapping):
        issues.error(base, "is required: the device requests and their config")
        return ClaimSpec((), ())
    requests = read_requests(devices, base, issues, api_version, bounded=bounded)
    configs = read_configs(devices.get("config"), base / "config", issues)
    return ClaimSpec(tuple(requests), tuple(configs))


def decode_spec(devices: object, base: FieldPath = ROOT / "spec" / "devices") -> ClaimSpec:
    """`read_spec`, strict: SpecError for the first field that is not what the API allows."""
    return strictly(lambda issues: read_spec(devices, base, issues))


def decode_configs(raw: object, path: FieldPath) -> list[ConfigSpec]:
    """`read_configs`, strict."""
    return strictly(lambda issues: read_configs(raw, path, issues))
