"""kubelet's device-health stream (KEP-4680): every published device's health, again on each
change; a failed link's devices are Unhealthy with the reason."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from cnidra._proto.drahealth.v1alpha1 import api_pb2 as health
from cnidra.dra.plugin import HEALTH_REFRESH_SECONDS, DRAService
from cnidra.inventory.links import Link
from cnidra.inventory.publisher import HealthBoard, device_failures


async def test_the_stream_says_each_devices_health_and_again_when_it_changes() -> None:
    board = HealthBoard()
    board.update({"eth1": None, "net-data": None})
    service = DRAService(SimpleNamespace(node="node-a"), health=board)  # type: ignore[arg-type]
    stream: Any = service.node_watch_resources(b"", None)
    first = health.NodeWatchResourcesResponse.FromString(await anext(stream))
    assert [(d.device.pool_name, d.device.device_name, d.health) for d in first.devices] == [
        ("node-a", "eth1", health.HEALTHY),
        ("node-a", "net-data", health.HEALTHY),
    ]
    assert first.devices[0].health_check_timeout_seconds > 0
    board.update({"eth1": "link eth1: down", "net-data": "link eth1: down"})
    # on the change, not the refresh (half its period: a bound a slow machine does not reach)
    changed = await asyncio.wait_for(anext(stream), HEALTH_REFRESH_SECONDS / 2)
    second = health.NodeWatchResourcesResponse.FromString(changed)
    assert {d.device.device_name: (d.health, d.message) for d in second.devices} == {
        "eth1": (health.UNHEALTHY, "link eth1: down"),
        "net-data": (health.UNHEALTHY, "link eth1: down"),
    }
    await stream.aclose()


def test_a_devices_failure_is_its_links() -> None:
    up = Link("eth1", 2, "", 1500, "physical", None, "up")
    down = Link("eth2", 3, "", 1500, "physical", None, "down")
    assert device_failures({"eth1": up, "eth2": down}, {}) == {
        "eth1": None,
        "eth2": "link eth2: down",
    }


async def test_both_health_services_are_served_and_advertised() -> None:
    """kubelet 1.37 opens the health stream only when the plugin advertises the service among
    its supported versions, preferring v1; 1.36 calls v1alpha1 unasked."""
    from cnidra.dra.plugin import HEALTH_SERVICES, RegistrationService

    info = await RegistrationService("/x.sock").GetInfo(None, None)  # type: ignore[arg-type]
    assert "v1.DRAResourceHealth" in info.supported_versions
    assert "v1alpha1.DRAResourceHealth" in info.supported_versions
    assert info.supported_versions[0] == "v1.DRAPlugin"  # kubelet 1.36 takes the first it knows
    service = DRAService(SimpleNamespace(node="node-a"), health=HealthBoard())  # type: ignore[arg-type]
    served = {path.split("/")[1] for path in service.methods()}
    assert set(HEALTH_SERVICES) <= served


async def test_each_registration_by_kubelet_has_the_slices_checked() -> None:
    """kubelet deletes a driver's slices at its start and after it lost the plugin; each time
    it registers the plugin the publisher checks they are still there (SlicePublisher)."""
    from cnidra._proto.pluginregistration.v1 import api_pb2 as reg
    from cnidra.dra.plugin import RegistrationService

    service = RegistrationService("/x.sock")
    calls: list[int] = []
    service.on_registered = lambda: calls.append(service.registrations)
    for _ in range(2):  # the driver's start, then kubelet's restart
        await service.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True), None)
    await service.NotifyRegistrationStatus(reg.RegistrationStatus(error="refused"), None)
    assert calls == [1, 2]


def test_a_change_of_health_is_logged_once_naming_the_device_and_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    board = HealthBoard()
    with caplog.at_level(logging.INFO, "cnidra.inventory.publisher"):
        board.update({"eth1": None})  # first sight of a working device: nothing to say
        board.update({"eth1": "link eth1: admin-down"})
        board.update({"eth1": "link eth1: admin-down"})  # no change: said once
        board.update({"eth1": None})
    assert [r.getMessage() for r in caplog.records] == [
        "device eth1 unhealthy: link eth1: admin-down",
        "device eth1 healthy again (was: link eth1: admin-down)",
    ]
