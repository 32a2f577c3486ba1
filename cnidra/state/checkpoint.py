"""The node's durable record of prepared claims: what NodePrepareResources resolved, for which
pods, so that the NRI hook needs nothing from the apiserver.

Write-through: every change that writes a claim is durable (a frame of <state>/claims.log,
fsynced) before it is visible in memory; a removal is logged without an fsync (lost to a power
cut, the claim is back as before its unprepare: the safe way, nothing it held given to
another); one file per claim under <state>/claims/<uid>.json, written when the store
settles (start, a long log, a clean stop; cnidra.state.store); a restart reloads them all and
replays the log over them."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from cnidra.api.bandwidth import QuantityError, Rate, Terms
from cnidra.api.ownership import is_owned, owned_network, owned_network_name
from cnidra.api.refs import ObjectRef
from cnidra.cni.attach import Attachment
from cnidra.state.layout import StateLayout
from cnidra.state.store import JsonDirStore

log = logging.getLogger(__name__)
# 2: networks carry cnidra's own name and state directories (`network_label` is the user's).
# 3: an attachment carries the rate limit it is held to (`rate`: {rate, ceil} in bit/s, or
#    null); a version 2 record has none, read as no limit (what it was prepared with).
# 4: an attachment carries the network a policy's `policy-for` names (`policy_network`); an
#    older record has none: `legacy_policy_network` derives what it can (a NAD's from its
#    status name, a claim-defined network's from its owned name), else "" (no policy selects
#    the interface by its network until its pod is prepared again).
# 5: an attachment carries what its rate is decided from (`bandwidth`: {granted, link, rules,
#    deviceClass}, or null); an older record has none, and its rate stays as prepared.
VERSION = 5


def attachment_to_json(att: Attachment) -> dict[str, Any]:
    """An attachment's fields but its claim, which the enclosing record names."""
    return {
        "request": att.request,
        "pool": att.pool,
        "device": att.device,
        "if_name": att.if_name,
        "network": att.network,
        "capability_args": att.capability_args,
        "cni_args": [list(pair) for pair in att.cni_args],
        "share_id": att.share_id,
        "network_label": att.network_label,
        "parent": att.parent,
        "node_link_allowed": att.node_link_allowed,
        "on_demand": att.on_demand,
        "explicit_name": att.explicit_name,
        "if_name_prefix": att.if_name_prefix,
        "status_name": att.status_name,
        "ipam_claim": att.ipam_claim,
        "rate": rate_to_json(att.rate),
        "bandwidth": None if att.bandwidth is None else att.bandwidth.to_json(),
        "policy_network": att.policy_network,
    }


def rate_to_json(rate: Rate | None) -> dict[str, int] | None:
    return None if rate is None else {"rate": rate.rate, "ceil": rate.ceil}


def rate_from_json(data: Any) -> Rate | None:
    """A checkpointed rate limit; absent (a record before version 3) or null: none.
    ValueError (QuantityError) naming the field for one that is not a rate."""
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise ValueError(f"rate must be an object {{rate, ceil}} or null, got {data!r}")
    try:
        return Rate(data["rate"], data.get("ceil", data["rate"]))
    except KeyError:
        raise ValueError(f"rate must have a rate (bit/s), got {dict(data)!r}") from None
    except QuantityError as exc:
        raise ValueError(f"rate: {exc}") from None


def attachment_from_json(data: Mapping[str, Any], claim: ObjectRef) -> Attachment:
    return Attachment(
        claim=claim,
        request=data["request"],
        if_name=data["if_name"],
        network=data["network"],
        pool=data["pool"],
        device=data["device"],
        capability_args=data.get("capability_args") or {},
        cni_args=tuple((str(k), str(v)) for k, v in data.get("cni_args") or []),
        share_id=data.get("share_id"),
        network_label=data.get("network_label") or str(data["network"].get("name", "")),
        parent=str(data.get("parent") or ""),
        node_link_allowed=bool(data.get("node_link_allowed")),
        on_demand=bool(data.get("on_demand")),
        explicit_name=bool(data.get("explicit_name", True)),
        if_name_prefix=data.get("if_name_prefix"),
        status_name=str(data.get("status_name") or ""),
        ipam_claim=data.get("ipam_claim"),
        rate=rate_from_json(data.get("rate")),
        bandwidth=Terms.from_json(data.get("bandwidth")),
        policy_network=str(data["policy_network"] or "")
        if "policy_network" in data
        else legacy_policy_network(data, claim),
    )


def legacy_policy_network(data: Mapping[str, Any], claim: ObjectRef) -> str:
    """A record before version 4: a NAD's network from its status name (`ns/name`, what
    only a NAD has), a network the claim's namespace owns (`cnidra-ns.<ns>.<name>`) as the
    claim's; a class's or a CNINetwork's cannot be told apart: ""."""
    status = str(data.get("status_name") or "")
    if "/" in status:
        return status
    network = data.get("network")
    name = str(network.get("name", "")) if isinstance(network, Mapping) else ""
    label = str(data.get("network_label") or "")
    if label and not status and name == owned_network_name(label, claim.namespace):
        return f"claim:{claim.namespace}/{label}"
    return ""


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    ref: ObjectRef
    pod_uids: tuple[str, ...]
    devices: tuple[Attachment, ...]
    generation: int = 0
    # the pod's own name for a claim made from a template (pod.spec.resourceClaims[].name):
    # where containers find the claim's device metadata (KEP-5304)
    pod_claim_name: str | None = None

    @property
    def uid(self) -> str:
        return self.ref.uid

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "uid": self.ref.uid,
            "namespace": self.ref.namespace,
            "name": self.ref.name,
            "pod_uids": list(self.pod_uids),
            "devices": [attachment_to_json(d) for d in self.devices],
            "generation": self.generation,
            "pod_claim_name": self.pod_claim_name,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PreparedClaim:
        ref = ObjectRef(data["namespace"], data["name"], data["uid"])
        return cls(
            ref,
            tuple(data["pod_uids"]),
            tuple(attachment_from_json(d, ref) for d in data["devices"]),
            int(data.get("generation", 0)),
            data.get("pod_claim_name"),
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
            dev.network, owned_network_name(name, claim.ref.namespace), layout.private_dirs()
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
        return sorted(found, key=lambda c: (c.ref.namespace, c.ref.name))
