"""CNI results: parsing, checking and conversion across 0.3.0, 0.3.1, 0.4.0, 1.0.0 and 1.1.0;
results of 0.1.0 and 0.2.0 plugins (`ip4`/`ip6`) are read into the 1.0.0 form and kept there,
as libcni converts them for its callers."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from cnidra.api.constants import SUPPORTED_CNI_VERSIONS

_PRE_1_0 = ("0.3.0", "0.3.1", "0.4.0")
_LEGACY = ("0.1.0", "0.2.0")
_ROUTE_1_1_FIELDS = ("mtu", "advmss", "priority", "table", "scope")
_INTERFACE_1_1_FIELDS = ("socketPath", "pciID")


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


class _Interface(_Loose):
    name: str
    mac: str | None = None
    sandbox: str | None = None


class _IP(_Loose):
    address: str
    gateway: str | None = None
    interface: int | None = None


class _Route(_Loose):
    dst: str
    gw: str | None = None


class _DNS(_Loose):
    nameservers: list[str] | None = None
    domain: str | None = None
    search: list[str] | None = None
    options: list[str] | None = None


class _Result(_Loose):
    cniVersion: str | None = None
    interfaces: list[_Interface] | None = None
    ips: list[_IP] | None = None
    routes: list[_Route] | None = None
    dns: _DNS | None = None


class ResultError(ValueError):
    pass


@dataclass(frozen=True)
class Result:
    """A checked result as JSON data, in the version named by `cni_version`."""

    raw: Mapping[str, Any]

    @property
    def cni_version(self) -> str:
        return str(self.raw.get("cniVersion", ""))

    @classmethod
    def parse(cls, data: Any, config_version: str) -> Result:
        """Check `data` as a result; a missing cniVersion means the config's (libcni's rule)."""
        if not isinstance(data, dict):
            raise ResultError(f"result must be a JSON object, got {type(data).__name__}")
        if (data.get("cniVersion") or config_version) in _LEGACY:
            data = _from_legacy(data)
        try:
            _Result.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ResultError(f"result field {where}: {first['msg']}") from None
        for i, ip in enumerate(data.get("ips") or []):
            try:
                if "/" not in ip["address"]:
                    raise ValueError
                ipaddress.ip_interface(ip["address"])
            except ValueError:
                raise ResultError(
                    f"result ips[{i}].address {ip['address']!r} is not an address with a prefix"
                ) from None
        version = data.get("cniVersion") or config_version
        if version not in SUPPORTED_CNI_VERSIONS:
            raise ResultError(
                f"result version {version!r} is not supported; supported: "
                + ", ".join(SUPPORTED_CNI_VERSIONS)
            )
        return cls({**data, "cniVersion": version})

    def as_version(self, version: str) -> Result:
        if version not in SUPPORTED_CNI_VERSIONS:
            raise ResultError(f"cannot convert a result to version {version!r}")
        if version == self.cni_version or version in _LEGACY:
            return self
        data: dict[str, Any] = _deep_copy(self.raw)
        data["cniVersion"] = version
        if version in _PRE_1_0:
            for ip in data.get("ips") or []:
                ip["version"] = str(ipaddress.ip_interface(ip["address"]).version)
        else:
            for ip in data.get("ips") or []:
                ip.pop("version", None)
        if version != "1.1.0":
            for route in data.get("routes") or []:
                for key in _ROUTE_1_1_FIELDS:
                    route.pop(key, None)
            for iface in data.get("interfaces") or []:
                for key in _INTERFACE_1_1_FIELDS:
                    iface.pop(key, None)
        return Result(data)

    def sandbox_interfaces(self) -> list[tuple[int, Mapping[str, Any]]]:
        return [
            (i, iface)
            for i, iface in enumerate(self.raw.get("interfaces") or [])
            if iface.get("sandbox")
        ]

    def ips_of(self, index: int) -> list[str]:
        return [ip["address"] for ip in self.raw.get("ips") or [] if ip.get("interface") == index]

    def to_json(self) -> dict[str, Any]:
        copied: dict[str, Any] = _deep_copy(self.raw)
        return copied


def _from_legacy(data: Mapping[str, Any]) -> dict[str, Any]:
    """A 0.1.0/0.2.0 result in the 1.0.0 form: `ip4`/`ip6` become `ips` and `routes`."""
    ips: list[dict[str, Any]] = []
    routes: list[Any] = []
    for family in ("ip4", "ip6"):
        block = data.get(family)
        if isinstance(block, Mapping) and block.get("ip"):
            ip = {"address": block["ip"]}
            if block.get("gateway"):
                ip["gateway"] = block["gateway"]
            ips.append(ip)
            routes.extend(block.get("routes") or [])
    out: dict[str, Any] = {"cniVersion": "1.0.0", "ips": ips}
    if routes:
        out["routes"] = routes
    if data.get("dns"):
        out["dns"] = data["dns"]
    return out


def _deep_copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value
