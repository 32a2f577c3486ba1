"""Hot-plug in milliseconds: an on-demand attachment is not added at sandbox start, is plugged
and unplugged into the running sandbox with the same records, status and finalizer as the
start-time ones (which stay), a failing plug rolls back, and a crash mid-plug or mid-unplug is
finished by the next Synchronize without touching the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from cnidra.nri.lifecycle import PlugError
from cnidra.state.sandboxes import State
from tests.nri.fakes import Crash, FakePlugins, Node, network, pod, prepare


def with_extra(node: Node) -> None:
    prepare(node.checkpoint, "base", "a-uid", ("net1", network("base", "macvlan")))
    prepare(node.checkpoint, "extra", "a-uid", ("net2", network("extra", "bridge")), on_demand=True)


@pytest.mark.parametrize("hold_from_attach", [False, True])
async def test_plug_and_unplug_leave_the_start_time_interfaces_alone(
    tmp_path: Path, hold_from_attach: bool
) -> None:
    node = Node.start(tmp_path, hold_from_attach=hold_from_attach)
    with_extra(node)
    await node.hooks.run_pod_sandbox(pod("a"))
    assert [c.if_name for c in node.plugins.commands("ADD")] == ["net1"]  # not the on-demand one

    plugged = await node.lifecycle.plug("a-sandbox", "extra", "req0")
    assert plugged.result is not None and not plugged.pending
    record = node.store.get("a-sandbox")
    assert record is not None and record.state is State.ADDED
    assert [a.attachment.if_name for a in record.attachments] == ["net1", "net2"]
    extra = next(c for c in node.status.entries if c.name == "extra")
    assert node.status.finalizers.get(extra) is (True if hold_from_attach else None)
    assert node.status.entries[extra]
    with pytest.raises(PlugError, match="already has net2"):
        await node.lifecycle.plug("a-sandbox", "extra", "req0")

    await node.lifecycle.unplug("a-sandbox", "extra", "req0")
    assert [(c.command, c.if_name) for c in node.plugins.calls][-1] == ("DEL", "net2")
    record = node.store.get("a-sandbox")
    assert record is not None and [a.attachment.if_name for a in record.attachments] == ["net1"]
    assert node.status.finalizers.get(extra) is (False if hold_from_attach else None)
    assert not node.status.entries[extra]
    assert [e.kind for e in node.lifecycle.journal.entries] == ["Attached", "Attached", "Detached"]


async def test_only_on_demand_attachments_of_the_pod_can_be_plugged(tmp_path: Path) -> None:
    node = Node.start(tmp_path)
    with_extra(node)
    with pytest.raises(PlugError, match="no attached record"):
        await node.lifecycle.plug("a-sandbox", "extra", "req0")  # no sandbox yet
    await node.hooks.run_pod_sandbox(pod("a"))
    with pytest.raises(PlugError, match="no on-demand attachment for claim 'base'"):
        await node.lifecycle.plug("a-sandbox", "base", "req0")


async def test_a_pod_with_only_on_demand_networks_gets_a_record_to_plug_into(
    tmp_path: Path,
) -> None:
    node = Node.start(tmp_path)
    prepare(node.checkpoint, "extra", "a-uid", ("net2", network("extra", "bridge")), on_demand=True)
    await node.hooks.run_pod_sandbox(pod("a"))
    record = node.store.get("a-sandbox")
    assert record is not None and record.state is State.ADDED and record.attachments == ()
    await node.lifecycle.plug("a-sandbox", "extra", "req0")
    assert len(node.plugins.commands("ADD")) == 1


async def test_a_failing_plug_rolls_back_and_keeps_the_rest(tmp_path: Path) -> None:
    node = Node.start(tmp_path, FakePlugins(failing={"bridge": "ADD"}))
    with_extra(node)
    await node.hooks.run_pod_sandbox(pod("a"))
    with pytest.raises(PlugError, match="it broke"):
        await node.lifecycle.plug("a-sandbox", "extra", "req0")
    record = node.store.get("a-sandbox")
    assert record is not None and [a.attachment.if_name for a in record.attachments] == ["net1"]
    assert [c.if_name for c in node.plugins.commands("DEL")] == ["net2"]  # rolled back


@pytest.mark.parametrize("crash_at", [("ADD", 2), ("DEL", 1)])
async def test_a_crash_mid_plug_or_unplug_is_finished_by_synchronize(
    tmp_path: Path, crash_at: tuple[str, int]
) -> None:
    node = Node.start(tmp_path, FakePlugins(crash_at=crash_at))
    with_extra(node)
    await node.hooks.run_pod_sandbox(pod("a"))
    with pytest.raises(Crash):
        await node.lifecycle.plug("a-sandbox", "extra", "req0")
        await node.lifecycle.unplug("a-sandbox", "extra", "req0")

    again = Node.start(tmp_path)
    await again.hooks.synchronize([pod("a")])
    record = again.store.get("a-sandbox")
    assert record is not None and record.state is State.ADDED
    assert [a.attachment.if_name for a in record.attachments] == ["net1"]
    assert [c.if_name for c in again.plugins.commands("DEL")] == ["net2"]
