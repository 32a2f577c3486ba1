"""ResourceClaim status entries: shape, and the apiserver's limits respected with a note."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from cnidra.api.refs import ObjectRef
from cnidra.cni.attach import Attachment, Outcome
from cnidra.cni.result import Result
from cnidra.status.devices import device_status

NOW = datetime(2026, 11, 21, 12, 0, 0, tzinfo=UTC)
ATT = Attachment(
    ObjectRef("ns", "c", "u"),
    "net",
    "net1",
    {"name": "data", "plugins": []},
    "node-1",
    "eth1",
    share_id="s-1",
)


def result(ips: int = 1, routes: int = 0) -> Result:
    return Result.parse(
        {
            "cniVersion": "1.1.0",
            "interfaces": [{"name": "net1", "mac": "02:00:00:00:00:01", "sandbox": "/run/netns/p"}],
            "ips": [
                {"address": f"198.18.{i // 250}.{i % 250 + 1}/16", "interface": 0}
                for i in range(ips)
            ],
            "routes": [
                {"dst": f"203.0.113.{i % 250}/32", "gw": "198.18.0.1"} for i in range(routes)
            ],
        },
        "1.1.0",
    )


def test_ready_entry_has_the_shape_users_expect() -> None:
    entry = device_status(Outcome(ATT, result()), now=NOW)
    assert (entry["driver"], entry["pool"], entry["device"], entry["shareID"]) == (
        "cni.dra.networking.x-k8s.io",
        "node-1",
        "eth1",
        "s-1",
    )
    assert entry["conditions"] == [
        {
            "type": "Ready",
            "status": "True",
            "reason": "NetworkInterfaceReady",
            "message": "net1 is configured by network data",
            "lastTransitionTime": "2026-11-21T12:00:00Z",
        }
    ]
    assert entry["networkData"] == {
        "interfaceName": "net1",
        "ips": ["198.18.0.1/16"],
        "hardwareAddress": "02:00:00:00:00:01",
    }
    assert entry["data"]["cniVersion"] == "1.1.0"


def test_failure_entry_carries_the_plugins_message_and_no_data() -> None:
    entry = device_status(
        Outcome(ATT, None, "plugin 'macvlan' ADD failed: Link not found"), now=NOW
    )
    [cond] = entry["conditions"]
    assert (cond["status"], cond["reason"]) == ("False", "NetworkInterfaceNotReady")
    assert cond["message"] == "plugin 'macvlan' ADD failed: Link not found"
    assert "data" not in entry and "networkData" not in entry


def test_more_than_16_ips_are_trimmed_and_said_so() -> None:
    entry = device_status(Outcome(ATT, result(ips=20)), now=NOW)
    assert len(entry["networkData"]["ips"]) == 16
    assert "20 addresses, status shows the first 16" in entry["conditions"][0]["message"]


def test_data_over_10_kib_is_trimmed_and_said_so() -> None:
    entry = device_status(Outcome(ATT, result(routes=400)), now=NOW)
    assert len(json.dumps(entry["data"], separators=(",", ":"))) <= 10 * 1024
    assert "routes" not in entry["data"] and entry["data"]["ips"]
    assert "data trimmed" in entry["conditions"][0]["message"]
    assert len(entry["conditions"]) <= 8


def test_the_typed_status_is_the_entry_and_its_key() -> None:
    from cnidra.status.devices import DeviceStatus, device_status_of

    typed = device_status_of(Outcome(ATT, result()), now=NOW)
    assert typed.key == ("cni.dra.networking.x-k8s.io", "node-1", "eth1", "s-1")
    assert typed.entry() == device_status(Outcome(ATT, result()), now=NOW)
    assert DeviceStatus.from_entry(typed.entry()) == typed
    assert typed.network_data is not None and typed.network_data["interfaceName"] == "net1"
    failed = device_status_of(Outcome(ATT, None, "no link"), now=NOW)
    assert failed.network_data is None and failed.data is None
    assert "networkData" not in failed.entry() and "data" not in failed.entry()
