"""The node's durable record of prepared claims: what NodePrepareResources resolved, for which
pods, so that the NRI hook needs nothing from the apiserver.

Write-through: every change is written (atomically, fsynced) before it is visible in memory,
one file per claim under <state>/claims/<uid>.json; a restart reloads them all."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from cnidra.api.ownership import is_owned, owned_network, owned_network_name
from cnidra.state.layout import StateLayout
from cnidra.state.store import JsonDirStore

log = logging.getLogger(__name__)
# 2: networks carry cnidra's own name and state directories (`network_label` is the user's).
VERSION = 2


@dataclass(frozen=True)
class PreparedDevice:
    """One allocated device of ours and the attachment it becomes in the pod."""

    request: str
    pool: str
    device: str
    if_name: str
    network: Mapping[str, Any]
    capability_args: Mapping[str, Any] = field(default_factory=dict)
    cni_args: tuple[tuple[str, str], ...] = ()
    share_id: str | None = None
    network_label: str = ""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PreparedDevice:
        return cls(
            data["request"],
            data["pool"],
            data["device"],
            data["if_name"],
            data["network"],
            data.get("capability_args") or {},
            tuple((str(k), str(v)) for k, v in data.get("cni_args") or []),
            data.get("share_id"),
            data.get("network_label") or str(data["network"].get("name", "")),
        )


@dataclass(frozen=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    pod_uids: tuple[str, ...]
    devices: tuple[PreparedDevice, ...]
    generation: int = 0

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["version"] = VERSION
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PreparedClaim:
        return cls(
            data["uid"],
            data["namespace"],
            data["name"],
            tuple(data["pod_uids"]),
            tuple(PreparedDevice.from_json(d) for d in data["devices"]),
            int(data.get("generation", 0)),
        )


def upgrade(claim: PreparedClaim, layout: StateLayout) -> PreparedClaim:
    """A claim prepared by cnidra 0.1 named its networks as the user did and left plugin
    state in the shared directory: give it the names and directories of today, so the next
    sandbox of its pod (a sandbox restart, a node reboot) is cnidra's own."""
    devices = []
    for dev in claim.devices:
        name = str(dev.network.get("name", ""))
        if is_owned(name):
            devices.append(dev)
            continue
        owned = owned_network(
            dev.network, owned_network_name(name, claim.namespace), layout.private_dirs()
        )
        devices.append(replace(dev, network=owned, network_label=name))
    return replace(claim, devices=tuple(devices))


class Checkpoint(JsonDirStore[PreparedClaim]):
    """Prepared claims by UID, one file each under <state>/claims."""

    def __init__(self, layout: StateLayout) -> None:
        super().__init__(
            layout.claims,
            lambda data: upgrade(PreparedClaim.from_json(data), layout),
            PreparedClaim.to_json,
            lambda claim: claim.uid,
        )

    def for_pod(self, pod_uid: str) -> list[PreparedClaim]:
        """The pod's claims in a fixed order (namespace/name), so attach order is reproducible."""
        found = [c for c in self.all() if pod_uid in c.pod_uids]
        return sorted(found, key=lambda c: (c.namespace, c.name))
