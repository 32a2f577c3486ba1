"""Inputs of the runtime: a network configuration list and the per-attachment runtime config."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cnidra.api.netconf import plugin_type_problem, to_conflist
from cnidra.api.plugin_schema import ifname_problem
from cnidra.cni.errors import CNIRuntimeError, InvalidPluginType

_CONTAINER_ID = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$")
_NETWORK_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$")


def version_tuple(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in version.split("."))
    except ValueError:
        raise CNIRuntimeError(f"invalid cniVersion {version!r}") from None


@dataclass(frozen=True)
class NetworkConfigList:
    """A conflist, ready to run. `raw` is what the cache stores as `config`."""

    name: str
    cni_version: str
    plugins: tuple[Mapping[str, Any], ...]
    disable_check: bool = False
    disable_gc: bool = False
    raw: bytes = b""

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> NetworkConfigList:
        """Accept a conflist or a single-plugin conf; enforce the rules exec depends on."""
        conflist = to_conflist(config)
        name = conflist.get("name")
        if not isinstance(name, str) or not _NETWORK_NAME.match(name):
            raise CNIRuntimeError(f"invalid network name {name!r}")
        version = conflist.get("cniVersion")
        if not isinstance(version, str):
            raise CNIRuntimeError("network configuration has no cniVersion")
        version_tuple(version)
        plugins = conflist.get("plugins")
        if not isinstance(plugins, list) or not plugins:
            raise CNIRuntimeError(f"network {name!r} has no plugins")
        for plugin in plugins:
            if not isinstance(plugin, dict):
                raise CNIRuntimeError(f"network {name!r}: a plugin entry is not an object")
            problem = plugin_type_problem(plugin.get("type"))
            if problem:
                raise InvalidPluginType(f"network {name!r}: plugin type {problem}")
        raw = json.dumps(config, separators=(",", ":")).encode()
        return cls(
            name,
            version,
            tuple(plugins),
            bool(conflist.get("disableCheck", False)),
            bool(conflist.get("disableGC", False)),
            raw,
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> NetworkConfigList:
        try:
            parsed = json.loads(data)
        except json.JSONDecodeError as exc:
            raise CNIRuntimeError(f"network configuration is not JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise CNIRuntimeError("network configuration is not a JSON object")
        return cls.from_dict(parsed)

    def at_least(self, version: str) -> bool:
        return version_tuple(self.cni_version) >= version_tuple(version)


@dataclass(frozen=True)
class RuntimeConf:
    """One attachment: which container, which namespace, which interface."""

    container_id: str
    netns: str
    if_name: str
    args: tuple[tuple[str, str], ...] = ()
    capability_args: Mapping[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        if not _CONTAINER_ID.match(self.container_id):
            raise CNIRuntimeError(
                f"invalid container id {self.container_id!r}: letters, digits, "
                "'_', '.', '-', starting with a letter or digit"
            )
        problem = ifname_problem(self.if_name, allow_primary=True)
        if problem:
            raise CNIRuntimeError(f"invalid interface name {self.if_name!r}: {problem}")
        for key, value in self.args:
            if any(sep in key + value for sep in ";="):
                raise CNIRuntimeError(f"CNI_ARGS entry {key!r} must not contain ';' or '='")

    @property
    def cni_args(self) -> str:
        return ";".join(f"{k}={v}" for k, v in self.args)


@dataclass(frozen=True)
class GCAttachment:
    container_id: str
    if_name: str

    def to_json(self) -> dict[str, str]:
        return {"containerID": self.container_id, "ifname": self.if_name}
