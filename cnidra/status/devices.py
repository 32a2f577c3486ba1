"""ResourceClaim `status.devices[]` entries built from attach outcomes, within the API's limits.
Pure: no apiserver access here (see cnidra.status for the writer)."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from cnidra.api.bandwidth import Rate, format_rate
from cnidra.api.constants import (
    CONDITION_BANDWIDTH,
    CONDITION_POLICY,
    CONDITION_READY,
    DRIVER_NAME,
    REASON_BANDWIDTH,
    REASON_NOT_READY,
    REASON_POLICY_HOST_SIDE,
    REASON_POLICY_POD_NAMESPACE,
    REASON_POLICY_REFUSED,
    REASON_POLICY_UNDOABLE,
    REASON_READY,
    STATUS_DATA_MAX_BYTES,
    STATUS_HARDWARE_ADDRESS_MAX,
    STATUS_INTERFACE_NAME_MAX,
    STATUS_MAX_IPS,
)
from cnidra.api.netpolicy_node import POLICY_NETWORK_KEY
from cnidra.cni.attach import Attachment, Outcome
from cnidra.cni.result import Result

MESSAGE_MAX = 32768  # metav1.Condition.message


DeviceKey = tuple[str, str, str, str]  # driver, pool, device, shareID


@dataclass(frozen=True)
class Condition:
    """One condition of a device's status entry (metav1.Condition's fields), typed until the
    entry is written."""

    type: str
    status: str
    reason: str
    message: str
    last_transition_time: str  # RFC 3339, to the second
    observed_generation: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": self.type,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "lastTransitionTime": self.last_transition_time,
        }
        if self.observed_generation is not None:
            out["observedGeneration"] = self.observed_generation
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Condition:
        generation = raw.get("observedGeneration")
        return cls(
            str(raw.get("type") or ""),
            str(raw.get("status") or ""),
            str(raw.get("reason") or ""),
            str(raw.get("message") or ""),
            str(raw.get("lastTransitionTime") or ""),
            generation if isinstance(generation, int) else None,
        )

    def says_as(self, other: Condition | None) -> bool:
        """Whether `other` says the same (the times aside)."""
        return other is not None and (self.type, self.status, self.reason, self.message) == (
            other.type,
            other.status,
            other.reason,
            other.message,
        )


@dataclass(frozen=True)
class DeviceStatus:
    """One ResourceClaim `status.devices` entry of cnidra's, typed: which device (its key), its
    conditions, its networkData and its CNI result (`data`, fitted to the API's limits)."""

    pool: str
    device: str
    share_id: str
    conditions: tuple[Condition, ...]
    network_data: Mapping[str, Any] | None = None
    data: Mapping[str, Any] | None = None
    driver: str = DRIVER_NAME

    @property
    def key(self) -> DeviceKey:
        return (self.driver, self.pool, self.device, self.share_id)

    def entry(self) -> dict[str, Any]:
        """The entry as the API takes it."""
        entry: dict[str, Any] = {"driver": self.driver, "pool": self.pool, "device": self.device}
        if self.share_id:
            entry["shareID"] = self.share_id
        if self.data is not None:
            entry["data"] = dict(self.data)
        if self.network_data is not None:
            entry["networkData"] = dict(self.network_data)
        entry["conditions"] = [c.to_json() for c in self.conditions]
        return entry

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> DeviceStatus:
        return cls(
            entry["pool"],
            entry["device"],
            entry.get("shareID") or "",
            tuple(
                Condition.from_json(c)
                for c in entry.get("conditions") or ()
                if isinstance(c, Mapping)
            ),
            entry.get("networkData"),
            entry.get("data"),
            entry.get("driver", DRIVER_NAME),
        )


def device_status(
    outcome: Outcome, now: datetime | None = None, observed_generation: int | None = None
) -> dict[str, Any]:
    """The attach outcome's entry as the API takes it (`DeviceStatus.entry`)."""
    return device_status_of(outcome, now, observed_generation).entry()


def device_status_of(
    outcome: Outcome, now: datetime | None = None, observed_generation: int | None = None
) -> DeviceStatus:
    att = outcome.attachment
    notes: list[str] = []
    data: dict[str, Any] | None = None
    network_data: dict[str, Any] | None = None
    if outcome.ready and outcome.result is not None:
        message = f"{att.if_name} is configured by network {att.network_name}"
        data, data_note = fit_data(outcome.result.to_json())
        if data_note:
            notes.append(data_note)
        network_data, nd_notes = network_data_of(outcome.result, att.if_name)
        notes.extend(nd_notes)
        condition = _condition("True", REASON_READY, message, now, observed_generation)
    else:
        condition = _condition(
            "False", REASON_NOT_READY, outcome.error or "not attached", now, observed_generation
        )
    if notes:
        condition = replace(condition, message=_clip(f"{condition.message} ({'; '.join(notes)})"))
    conditions = [condition]
    if outcome.ready and att.rate is not None:
        conditions.append(
            _condition(
                "True",
                REASON_BANDWIDTH,
                rate_message(att.if_name, att.rate),
                now,
                observed_generation,
                CONDITION_BANDWIDTH,
            )
        )
    return DeviceStatus(
        att.pool, att.device, att.share_id or "", tuple(conditions), network_data, data
    )


def policy_condition(
    if_name: str,
    network: str,
    refused: str = "",
    undoable_by: Sequence[str] = (),
    now: datetime | None = None,
    *,
    host_if: str = "",
    bridge: str = "",
) -> Condition:
    """The NetworkPolicyEnforced condition of an interface on a network policy can name
    (`network`, as `policy-for` names it): False with why when policy cannot be enforced on it
    (`refused`, the plugin type's reason) or when containers of its pod could delete the table
    in its namespace (`undoable_by`); else True (`host_if`: on the host's end of its veth, a
    port of `bridge` when it is one). The message names no policy, so a policy change does not
    rewrite the claim's status."""
    if refused:
        return _condition(
            "False",
            REASON_POLICY_REFUSED,
            f"network policy for {network} cannot be enforced on {if_name}: {refused}",
            now,
            None,
            CONDITION_POLICY,
        )
    if host_if:
        return _condition(
            "True",
            REASON_POLICY_HOST_SIDE,
            f"network policy for {network} is enforced for {if_name} on the host's end of its "
            f"veth ({host_if}"
            + (f", a port of bridge {bridge}, by the pod's addresses" if bridge else "")
            + "), where the pod cannot undo it",
            now,
            None,
            CONDITION_POLICY,
        )
    if undoable_by:
        return _condition(
            "False",
            REASON_POLICY_UNDOABLE,
            f"network policy for {network} is enforced on {if_name} in the pod's network "
            f"namespace, where containers {', '.join(undoable_by)} (privileged or with "
            "CAP_NET_ADMIN) can delete it",
            now,
            None,
            CONDITION_POLICY,
        )
    return _condition(
        "True",
        REASON_POLICY_POD_NAMESPACE,
        f"network policy for {network} is enforced on {if_name} in the pod's network namespace",
        now,
        None,
        CONDITION_POLICY,
    )


def same_condition(a: Condition | None, b: Condition | None) -> bool:
    """Whether two conditions say the same (their times aside)."""
    if a is None or b is None:
        return a is b
    return a.says_as(b)


def with_conditions(status: DeviceStatus, extra: Sequence[Condition]) -> DeviceStatus:
    """`status` with `extra` conditions, each replacing one of its type."""
    if not extra:
        return status
    types = {c.type for c in extra}
    kept = tuple(c for c in status.conditions if c.type not in types)
    return replace(status, conditions=(*kept, *extra))


def rate_message(if_name: str, rate: Rate) -> str:
    """What the BandwidthLimited condition says: the limit, in both directions, in bit/s."""
    held = f"{if_name} is held to {format_rate(rate.rate)}bit/s in each direction"
    if rate.burst:
        return f"{held}, bursting to {format_rate(rate.ceil)}bit/s while the link has room"
    return held


def network_data_of(result: Result, if_name: str) -> tuple[dict[str, Any], list[str]]:
    notes: list[str] = []
    sandbox = result.sandbox_interfaces()
    chosen = next(
        ((i, f) for i, f in sandbox if f.get("name") == if_name), sandbox[0] if sandbox else None
    )
    if chosen is not None:
        index, iface = chosen
        ips = result.ips_of(index) or [
            ip["address"] for ip in result.raw.get("ips") or [] if ip.get("interface") is None
        ]
        name, mac = str(iface.get("name") or if_name), str(iface.get("mac") or "")
    else:
        ips = [ip["address"] for ip in result.raw.get("ips") or []]
        name, mac = if_name, ""
    ips = list(dict.fromkeys(_canonical(ip) for ip in ips))
    if len(ips) > STATUS_MAX_IPS:
        notes.append(f"{len(ips)} addresses, status shows the first {STATUS_MAX_IPS}")
        ips = ips[:STATUS_MAX_IPS]
    data: dict[str, Any] = {"interfaceName": name[:STATUS_INTERFACE_NAME_MAX]}
    if ips:
        data["ips"] = ips
    if mac:
        data["hardwareAddress"] = mac[:STATUS_HARDWARE_ADDRESS_MAX]
    return data, notes


def fit_data(result: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The CNI result, trimmed to the 10 KiB the apiserver accepts for `data`."""
    if _size(result) <= STATUS_DATA_MAX_BYTES:
        return result, None
    dropped: list[str] = []
    trimmed = dict(result)
    for key in ("dns", "routes", "interfaces"):
        if key in trimmed:
            trimmed.pop(key)
            dropped.append(key)
            if _size(trimmed) <= STATUS_DATA_MAX_BYTES:
                return (
                    trimmed,
                    f"data trimmed to fit {STATUS_DATA_MAX_BYTES} bytes: "
                    f"dropped {', '.join(dropped)}",
                )
    minimal = {"cniVersion": result.get("cniVersion")}
    return minimal, f"data dropped: the CNI result is larger than {STATUS_DATA_MAX_BYTES} bytes"


def _canonical(address: str) -> str:
    return str(ipaddress.ip_interface(address))


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")).encode())


def _condition(
    status: str,
    reason: str,
    message: str,
    now: datetime | None,
    generation: int | None,
    type_: str = CONDITION_READY,
) -> Condition:
    stamp = (now or datetime.now(UTC)).replace(microsecond=0)
    return Condition(
        type_, status, reason, _clip(message), stamp.strftime("%Y-%m-%dT%H:%M:%SZ"), generation
    )


def _clip(message: str) -> str:
    return message if len(message) <= MESSAGE_MAX else message[: MESSAGE_MAX - 3] + "..."


NETWORK_STATUS_ANNOTATION = "k8s.v1.cni.cncf.io/network-status"


@dataclass(frozen=True)
class NetworkStatus:
    """One interface of the pod's `network-status` annotation, as Multus lists it (the
    multi-net spec's NetworkStatus: name, interface, ips without prefix, mac, dns, default,
    gateway), and the network peers' policies know it by."""

    name: str
    interface: str
    ips: tuple[str, ...] = ()
    mac: str = ""
    dns: Mapping[str, Any] | None = None
    gateway: tuple[str, ...] = ()
    policy_network: str = ""  # POLICY_NETWORK_KEY's value ("": none)

    def entry(self) -> dict[str, Any]:
        """The annotation's JSON entry (its empty fields left out, `default` always said)."""
        out: dict[str, Any] = {
            "name": self.name,
            "interface": self.interface,
            "ips": list(self.ips),
            "default": False,
        }
        if self.mac:
            out["mac"] = self.mac
        if self.policy_network:  # what peers' policies know the network by (every node reads it)
            out[POLICY_NETWORK_KEY] = self.policy_network
        if self.dns:
            out["dns"] = dict(self.dns)
        if self.gateway:
            out["gateway"] = list(self.gateway)
        return out


def network_status(attached: Sequence[tuple[Attachment, Result]]) -> list[NetworkStatus]:
    """The pod's cnidra interfaces as the `network-status` annotation lists them."""
    out: list[NetworkStatus] = []
    for att, result in attached:
        data, _ = network_data_of(result, att.if_name)
        dns = result.raw.get("dns")
        out.append(
            NetworkStatus(
                att.status_name or att.network_name,
                data["interfaceName"],
                tuple(ip.split("/")[0] for ip in data.get("ips") or []),
                str(data.get("hardwareAddress") or ""),
                dns if isinstance(dns, dict) and dns else None,
                tuple(ip["gateway"] for ip in result.raw.get("ips") or [] if ip.get("gateway")),
                att.policy_network or "",
            )
        )
    return out
