"""The CNIConfig v1alpha1 API: what users put in a claim's opaque parameters."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from cnidra.api.constants import KIND, LEGACY_KIND
from cnidra.api.networks import NetworkRef

_MAC = re.compile(r"^([0-9A-Fa-f]{2}[:-]){5}[0-9A-Fa-f]{2}$")
_GUID = re.compile(r"^([0-9A-Fa-f]{2}:){7}[0-9A-Fa-f]{2}$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# CNI_ARGS is `K=V;K2=V2`: keys and values cannot carry the separators.
_ARG_KEY = re.compile(r"^[A-Za-z0-9_.\-]+$")


def _ip(value: str) -> str:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(
            f"{value!r} is not an IP address (e.g. 192.0.2.1 or 2001:db8::1)"
        ) from None
    return value


def _cidr(value: str) -> str:
    try:
        if "/" not in value:
            raise ValueError
        ipaddress.ip_interface(value)
    except ValueError:
        raise ValueError(
            f"{value!r} is not an address with a prefix length (e.g. 192.0.2.10/24)"
        ) from None
    return value


def _mac(value: str) -> str:
    if not _MAC.match(value):
        raise ValueError(f"{value!r} is not a MAC address (e.g. 02:00:00:00:00:01)")
    return value


def _guid(value: str) -> str:
    if not _GUID.match(value):
        raise ValueError(f"{value!r} is not an InfiniBand GUID (8 hex bytes separated by ':')")
    return value


def _subdomain(value: str) -> str:
    if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        raise ValueError(
            f"{value!r} is not a Kubernetes object name (lowercase letters, digits, "
            "'-' and '.', at most 253 characters)"
        )
    return value


def _cni_args(value: dict[str, str]) -> dict[str, str]:
    for key, val in value.items():
        if not _ARG_KEY.match(key):
            raise ValueError(f"key {key!r} may only use letters, digits, '_', '.', '-'")
        if ";" in val or "=" in val:
            raise ValueError(f"value of {key!r} must not contain ';' or '=' (CNI_ARGS separators)")
    return value


IP = Annotated[str, AfterValidator(_ip)]
CIDR = Annotated[str, AfterValidator(_cidr)]
Port = Annotated[int, Field(ge=1, le=65535)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class PortMapping(_Strict):
    host_port: Port = Field(alias="hostPort")
    container_port: Port = Field(alias="containerPort")
    protocol: Literal["tcp", "udp", "sctp"] = "tcp"
    host_ip: IP | None = Field(default=None, alias="hostIP")


class Bandwidth(_Strict):
    ingress_rate: Annotated[int, Field(ge=0)] | None = Field(default=None, alias="ingressRate")
    ingress_burst: Annotated[int, Field(ge=0)] | None = Field(default=None, alias="ingressBurst")
    egress_rate: Annotated[int, Field(ge=0)] | None = Field(default=None, alias="egressRate")
    egress_burst: Annotated[int, Field(ge=0)] | None = Field(default=None, alias="egressBurst")


class DNS(_Strict):
    nameservers: list[IP] = Field(default_factory=list)
    domain: str | None = None
    search: list[str] = Field(default_factory=list)
    options: list[str] = Field(default_factory=list)


class Capabilities(_Strict):
    """Values handed to plugins as `runtimeConfig`, for the capabilities they declare."""

    port_mappings: list[PortMapping] | None = Field(default=None, alias="portMappings")
    bandwidth: Bandwidth | None = None
    ips: list[CIDR] | None = None
    mac: Annotated[str, AfterValidator(_mac)] | None = None
    dns: DNS | None = None
    infiniband_guid: Annotated[str, AfterValidator(_guid)] | None = Field(
        default=None, alias="infinibandGUID"
    )

    def runtime_values(self) -> dict[str, Any]:
        """The capability args keyed as the CNI conventions name them."""
        return self.model_dump(by_alias=True, exclude_none=True)


class CNIConfig(_Strict):
    """Opaque parameters for driver cni.dra.networking.x-k8s.io.

    `if_name` and `config` are optional here because a DeviceClass may supply them;
    a config ready to attach has both (see `cnidra.api.validate`).
    """

    api_version: Literal["cni.networking.x-k8s.io/v1alpha1"] = Field(
        default="cni.networking.x-k8s.io/v1alpha1", alias="apiVersion"
    )
    kind: Literal["CNIConfig", "CNI"] = KIND
    if_name: str | None = Field(default=None, alias="ifName")
    # named by prefix and index, or `net<N>` when neither is set (cnidra.api.naming)
    if_name_prefix: str | None = Field(default=None, alias="ifNamePrefix")
    config: dict[str, Any] | None = None
    # a named network instead of `config` (cnidra.api.networks)
    network: NetworkRef | None = None
    args: Annotated[dict[str, str], AfterValidator(_cni_args)] | None = None
    capabilities: Capabilities | None = None
    ipam_claim_reference: Annotated[str, AfterValidator(_subdomain)] | None = Field(
        default=None, alias="ipamClaimReference"
    )
    # PodStart (the default): added when the pod's sandbox starts. OnDemand: prepared with the
    # pod but added and removed through the node API (hot-plug), not at sandbox start.
    attach: Literal["PodStart", "OnDemand"] | None = None

    @property
    def is_legacy_kind(self) -> bool:
        return self.kind == LEGACY_KIND

    def to_parameters(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


CNICONFIG_FIELDS = (
    "apiVersion",
    "kind",
    "ifName",
    "ifNamePrefix",
    "config",
    "network",
    "args",
    "capabilities",
    "ipamClaimReference",
    "attach",
)
