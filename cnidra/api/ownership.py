"""What cnidra owns on a node, decided before any plugin runs. Pure: no I/O.

Two rules keep cnidra a guest beside the node's primary CNI:

- **Names cnidra owns.** The network name handed to plugins (which keys the CNI result cache,
  host-local's pool directory, portmap's chains) is derived by the driver, never taken from the
  user: `cnidra-ns.<namespace>.<config.name>` for a network a claim defines or changes, and
  `cnidra-cluster.<config.name>` for one defined wholly by the DeviceClass (the admin's, shared
  by every namespace that uses the class). A namespace is a DNS label (no dots), so the two
  forms never meet, and no tenant can name another tenant's network or the primary network.
  The user's `config.name` stays the label shown in status and events.
- **Private state.** Plugins that keep state on disk get a directory under cnidra's state root
  (host-local's `ipam.dataDir`, tuning's `dataDir`); a config that names its own is refused,
  because a root process must not write where a claim points it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cnidra.api.issues import FieldPath, Issues

OWNED_PREFIX = "cnidra-"
TENANT_PREFIX = "cnidra-ns."
CLUSTER_PREFIX = "cnidra-cluster."
# Result cache files are named <network>-<containerID>-<ifName>; a file name has 255 bytes, a
# container ID 64, an ifName 15. 128 leaves room and keeps names readable in `ls`.
NAME_MAX = 128


@dataclass(frozen=True)
class PrivateDirs:
    """Where plugins keep their state, under cnidra's state root."""

    ipam: str
    tuning: str


def owned_network_name(config_name: str, namespace: str | None) -> str:
    """The name plugins see. `namespace` None: a DeviceClass (cluster-wide) network."""
    name = (
        f"{CLUSTER_PREFIX}{config_name}"
        if namespace is None
        else f"{TENANT_PREFIX}{namespace}.{config_name}"
    )
    if len(name) <= NAME_MAX:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return f"{name[: NAME_MAX - 13]}-{digest}"


def is_owned(network_name: str) -> bool:
    return network_name.startswith(OWNED_PREFIX)


def state_field_problems(config: Mapping[str, Any], path: FieldPath, issues: Issues) -> None:
    """Errors for state directories a conf or conflist sets itself (cnidra chooses them)."""
    plugins = config.get("plugins")
    located = (
        [(p, path / "plugins" / i) for i, p in enumerate(plugins)]
        if isinstance(plugins, list)
        else [(config, path)]
    )
    for plugin, ppath in located:
        if not isinstance(plugin, Mapping):
            continue
        if plugin.get("type") == "tuning" and "dataDir" in plugin:
            issues.error(
                ppath / "dataDir",
                "is chosen by cnidra (a directory under its state root); remove it",
            )
        ipam = plugin.get("ipam")
        if isinstance(ipam, Mapping) and ipam.get("type") == "host-local" and "dataDir" in ipam:
            issues.error(
                ppath / "ipam" / "dataDir",
                "is chosen by cnidra (host-local keeps each network's pool under cnidra's "
                "state root); remove it",
            )


def owned_network(conflist: Mapping[str, Any], name: str, dirs: PrivateDirs) -> dict[str, Any]:
    """The conflist as plugins will see it: cnidra's name, state directories under its root."""
    plugins = []
    for original in conflist.get("plugins") or []:
        plugin = dict(original)
        if plugin.get("type") == "tuning":
            plugin["dataDir"] = dirs.tuning
        ipam = plugin.get("ipam")
        if isinstance(ipam, Mapping) and ipam.get("type") == "host-local":
            plugin["ipam"] = {**ipam, "dataDir": dirs.ipam}
        plugins.append(plugin)
    return {**conflist, "name": name, "plugins": plugins}
