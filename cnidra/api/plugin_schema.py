"""Machine-readable schemas of the reference CNI plugins and IPAM plugins.

Each plugin is one JSON Schema file under `schemas/plugins/` (or `schemas/ipam/`) listing the
fields that plugin reads, in the release `defs.json` names (`x-release`; a test keeps the files
in step with the plugins the test bed builds); the keys every plugin may carry come from
`defs.json`. `x-role` says whether a plugin makes the pod's interface or modifies one made
before it, `x-minCNIVersion` the oldest config version it runs. Adding a plugin means adding one
file. Unknown fields of a known plugin are warnings: the plugin ignores them.

jsonschema (and its `referencing`) is imported when a schema is first built: the driver
validates a network only when a claim or class embeds one, and at rest it holds none of it
(about 3 MiB of RSS; tests/test_lazy.py).
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from cnidra.api.constants import IFNAME_MAX_BYTES

if TYPE_CHECKING:
    import jsonschema.protocols
    from jsonschema import FormatChecker
    from referencing import Registry

_MAC = re.compile(r"^([0-9A-Fa-f]{2}[:-]){5}[0-9A-Fa-f]{2}$")
_MTU_MIN, _MTU_MAX = 68, 65535


def _is_ifname(value: object) -> bool:
    return not isinstance(value, str) or ifname_problem(value, allow_primary=True) is None


def _is_mac(value: object) -> bool:
    return not isinstance(value, str) or bool(_MAC.match(value))


def _is_cidr(value: object) -> bool:
    return not isinstance(value, str) or parse_interface(value) is not None


def _is_ip(value: object) -> bool:
    return not isinstance(value, str) or parse_ip(value) is not None


def _is_mtu(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int):
        return True
    return value == 0 or _MTU_MIN <= value <= _MTU_MAX


@cache
def format_checker() -> FormatChecker:
    """The formats the schemas name beyond JSON Schema's own (defs.json)."""
    from jsonschema import FormatChecker

    checker = FormatChecker()
    for name, check in (
        ("ifname", _is_ifname),
        ("mac", _is_mac),
        ("cidr", _is_cidr),
        ("ip", _is_ip),
        ("mtu", _is_mtu),
    ):
        checker.checks(name)(check)
    return checker


FORMAT_HINTS = {
    "ifname": "must be a Linux interface name (1-15 bytes, no '/', ':' or whitespace)",
    "mac": "must be a MAC address like 02:00:00:00:00:01",
    "cidr": "must be an address with a prefix length, like 192.0.2.10/24 or 2001:db8::1/64",
    "ip": "must be an IP address, like 192.0.2.1 or 2001:db8::1",
    "mtu": f"must be 0 (the kernel's default) or between {_MTU_MIN} and {_MTU_MAX}",
}


def parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def parse_interface(text: str) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface | None:
    if "/" not in text:
        return None
    try:
        return ipaddress.ip_interface(text)
    except ValueError:
        return None


def ifname_problem(name: str, *, allow_primary: bool = False) -> str | None:
    """Why the kernel (or Kubernetes) would refuse this interface name, or None."""
    if name == "":
        return "must not be empty"
    if len(name.encode()) > IFNAME_MAX_BYTES:
        return f"is {len(name.encode())} bytes; Linux allows at most {IFNAME_MAX_BYTES}"
    if name in (".", ".."):
        return "must not be '.' or '..'"
    bad = sorted({c for c in name if c in "/:" or c.isspace()})
    if bad:
        shown = ", ".join(repr(c) for c in bad)
        return f"must not contain {shown} (no '/', ':' or whitespace)"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "must not contain control characters (NUL, ...)"
    if not allow_primary and name == "eth0":
        return (
            "'eth0' is the pod's primary interface, owned by the cluster network; "
            "pick another name such as net1"
        )
    return None


@dataclass(frozen=True)
class PluginSchema:
    kind: str  # "plugins" or "ipam"
    type: str
    document: dict[str, Any]
    validator: jsonschema.protocols.Validator
    own_fields: tuple[str, ...]
    release: str = ""

    @property
    def fields(self) -> list[str]:
        return sorted(self.document["properties"])


def _load_json(*parts: str) -> dict[str, Any]:
    ref = resources.files("cnidra.api").joinpath("schemas").joinpath(*parts)
    data: dict[str, Any] = json.loads(ref.read_text())
    return data


@cache
def _registry() -> Registry[Any]:
    from referencing import Registry, Resource

    defs = _load_json("defs.json")
    registry: Registry[Any] = Registry().with_resource("defs.json", Resource.from_contents(defs))
    return registry


def _names(kind: str) -> Iterator[str]:
    folder = resources.files("cnidra.api").joinpath("schemas").joinpath(kind)
    for entry in folder.iterdir():
        if entry.name.endswith(".json"):
            yield entry.name.removesuffix(".json")


@cache
def known_types(kind: str) -> frozenset[str]:
    return frozenset(_names(kind))


@cache
def schema_for(kind: str, plugin_type: str) -> PluginSchema | None:
    if plugin_type not in known_types(kind):
        return None
    doc = _load_json(kind, f"{plugin_type}.json")
    properties: dict[str, Any] = {}
    if kind == "plugins":
        properties.update(_load_json("defs.json")["$defs"]["common"])
        properties.pop("$comment", None)
        properties = {k: _rebase(v) for k, v in properties.items()}
    properties.update(doc.get("properties", {}))
    full = {
        "type": "object",
        "properties": properties,
        "required": doc.get("required", []),
        "additionalProperties": False,
        **{k: v for k, v in doc.items() if k.startswith("x-")},
    }
    from jsonschema import Draft202012Validator, validators

    validator_cls = validators.validator_for(full, default=Draft202012Validator)
    validator = validator_cls(full, registry=_registry(), format_checker=format_checker())
    own = tuple(sorted(doc.get("properties", {})))
    release = str(_load_json("defs.json").get("x-release", ""))
    return PluginSchema(kind, plugin_type, full, validator, own, release)


def _rebase(node: Any) -> Any:
    """Point local `#/$defs/...` references of defs.json at that file."""
    if isinstance(node, dict):
        return {
            k: (
                f"defs.json{v}"
                if k == "$ref" and isinstance(v, str) and v.startswith("#")
                else _rebase(v)
            )
            for k, v in node.items()
        }
    return node
