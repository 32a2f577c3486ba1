"""Issue 44 on the hook path: an attachment with a rate is held to it right after its ADD,
within the hook's budget; a limit that cannot be applied fails the attachment (rolled back,
an event and a metric naming it); an unplug removes the limit after its DEL."""

from __future__ import annotations

from pathlib import Path

import pytest

from cnidra.api.bandwidth import Rate
from cnidra.api.constants import CONDITION_BANDWIDTH
from cnidra.cni.attach import SetupFailed
from cnidra.cni.invoke import Deadline
from cnidra.nri.lifecycle import SHAPING_TIMEOUT, AttachError, PlugError
from cnidra.observe import metrics
from tests.nri.fakes import FakeShaper, Node, network, pod, prepare

LIMIT = Rate(100 * 10**6, 100 * 10**6)
NETNS = "/run/netns/a-sandbox"


def shaped_node(tmp_path: Path, shaper: FakeShaper) -> Node:
    node = Node.start(tmp_path, shaper=shaper)
    prepare(node.checkpoint, "fast", "a-uid", ("net1", network("fast", "macvlan")), rate=LIMIT)
    prepare(node.checkpoint, "open", "a-uid", ("net2", network("open", "bridge")))
    return node


def failures(reason: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "cnidra_attach_failures_total", {"network": "fast", "reason": reason}
    )
    return value or 0.0


async def test_an_attachment_with_a_rate_is_held_to_it_after_its_add(tmp_path: Path) -> None:
    shaper = FakeShaper()
    node = shaped_node(tmp_path, shaper)
    await node.hooks.run_pod_sandbox(pod("a"))
    assert shaper.limits == {(NETNS, "net1"): LIMIT}  # net2 has no rate: left alone
    [(op, netns, interface, timeout)] = shaper.calls
    assert (op, netns, interface) == ("apply", NETNS, "net1")
    # within what is left of the hook's ADD budget (0.3 s in the fake node)
    assert 0 < timeout <= 0.3 < SHAPING_TIMEOUT
    fast = next(c for c in node.status.entries if c.name == "fast")
    [entry] = node.status.entries[fast].values()
    ready, limited = entry["conditions"]
    assert ready["status"] == "True"
    assert limited["type"] == CONDITION_BANDWIDTH and limited["status"] == "True"
    assert limited["message"] == "net1 is held to 100Mbit/s in each direction"
    opened = next(c for c in node.status.entries if c.name == "open")
    [plain] = node.status.entries[opened].values()
    assert [c["type"] for c in plain["conditions"]] == ["Ready"]


async def test_a_limit_that_cannot_be_applied_fails_the_pod_closed(tmp_path: Path) -> None:
    shaper = FakeShaper(failing={("apply", "net1")})
    node = shaped_node(tmp_path, shaper)
    before = failures("shaping")
    with pytest.raises(AttachError, match=r"rate limit 100Mbit/s on net1 could not be applied"):
        await node.hooks.run_pod_sandbox(pod("a"))
    # rolled back: every ADD so far DELed, no record left, the failure counted as shaping's
    assert [c.if_name for c in node.plugins.commands("DEL")] == ["net1"]
    assert node.store.get("a-sandbox") is None
    assert failures("shaping") == before + 1
    [(_, reason, message)] = node.status.events
    assert reason == "NetworkAttachFailed" and "RTNETLINK said no" in message
    fast = next(c for c in node.status.entries if c.name == "fast")
    [entry] = node.status.entries[fast].values()
    assert [c["type"] for c in entry["conditions"]] == ["Ready"]
    assert entry["conditions"][0]["status"] == "False"
    assert "rate limit" in entry["conditions"][0]["message"]


async def test_no_time_left_in_the_budget_fails_the_limit_without_trying(
    tmp_path: Path,
) -> None:
    shaper = FakeShaper()
    node = Node.start(tmp_path, shaper=shaper)
    claim = prepare(node.checkpoint, "c", "a-uid", ("net1", network("c", "macvlan")), rate=LIMIT)
    shape = node.lifecycle.setup.after_add(NETNS, Deadline.after(0.0, "the pod's attach budget"))
    with pytest.raises(SetupFailed, match="the pod's attach budget of 0s ran out") as caught:
        await shape(claim.devices[0], None)
    assert caught.value.reason == "shaping" and shaper.calls == []


def plug_node(tmp_path: Path, shaper: FakeShaper) -> Node:
    node = Node.start(tmp_path, shaper=shaper)
    prepare(node.checkpoint, "base", "a-uid", ("net1", network("base", "macvlan")))
    prepare(
        node.checkpoint,
        "extra",
        "a-uid",
        ("net2", network("extra", "bridge")),
        on_demand=True,
        rate=LIMIT,
    )
    return node


async def test_plug_applies_and_unplug_removes_after_the_del(tmp_path: Path) -> None:
    shaper = FakeShaper()
    node = plug_node(tmp_path, shaper)
    await node.hooks.run_pod_sandbox(pod("a"))
    assert shaper.calls == []
    await node.lifecycle.plug("a-sandbox", "extra", "req0")
    assert shaper.limits == {(NETNS, "net2"): LIMIT}
    await node.lifecycle.unplug("a-sandbox", "extra", "req0")
    assert [(c[0], c[2]) for c in shaper.calls] == [("apply", "net2"), ("remove", "net2")]
    assert shaper.limits == {}
    assert node.plugins.calls[-1].command == "DEL"  # the DEL ran before the removal


async def test_an_unplug_whose_interface_took_its_limit_along_is_done(tmp_path: Path) -> None:
    shaper = FakeShaper(gone={"net2"})
    node = plug_node(tmp_path, shaper)
    await node.hooks.run_pod_sandbox(pod("a"))
    await node.lifecycle.plug("a-sandbox", "extra", "req0")
    await node.lifecycle.unplug("a-sandbox", "extra", "req0")  # Gone: done, no error
    record = node.store.get("a-sandbox")
    assert record is not None and [a.attachment.if_name for a in record.attachments] == ["net1"]
    assert [e.kind for e in node.lifecycle.journal.entries][-1] == "Detached"


async def test_a_failed_removal_is_journalled_but_the_unplug_stands(tmp_path: Path) -> None:
    shaper = FakeShaper(failing={("remove", "net2")})
    node = plug_node(tmp_path, shaper)
    await node.hooks.run_pod_sandbox(pod("a"))
    await node.lifecycle.plug("a-sandbox", "extra", "req0")
    await node.lifecycle.unplug("a-sandbox", "extra", "req0")
    kinds = [e.kind for e in node.lifecycle.journal.entries]
    assert kinds[-2:] == ["DetachFailed", "Detached"]
    assert "removing the rate limit of net2" in node.lifecycle.journal.entries[-2].message


async def test_a_plug_whose_limit_fails_is_rolled_back(tmp_path: Path) -> None:
    shaper = FakeShaper(failing={("apply", "net2")})
    node = plug_node(tmp_path, shaper)
    await node.hooks.run_pod_sandbox(pod("a"))
    with pytest.raises(PlugError, match="rate limit 100Mbit/s on net2 could not be applied"):
        await node.lifecycle.plug("a-sandbox", "extra", "req0")
    assert [(c.command, c.if_name) for c in node.plugins.calls][-1] == ("DEL", "net2")
    record = node.store.get("a-sandbox")
    assert record is not None and [a.attachment.if_name for a in record.attachments] == ["net1"]


async def test_a_sandbox_stop_leaves_the_limit_to_the_namespace(tmp_path: Path) -> None:
    """The namespace going removes the limit with it: no removal on the stop hook's path."""
    shaper = FakeShaper()
    node = shaped_node(tmp_path, shaper)
    await node.hooks.run_pod_sandbox(pod("a"))
    await node.hooks.stop_pod_sandbox(pod("a"))
    assert [c[0] for c in shaper.calls] == ["apply"]
    assert node.store.get("a-sandbox") is None


async def test_concurrent_adds_shape_each_and_a_failed_limit_rolls_all_back(
    tmp_path: Path,
) -> None:
    shaper = FakeShaper()
    node = shaped_node(tmp_path, shaper)
    node.lifecycle.concurrent = True
    await node.hooks.run_pod_sandbox(pod("a"))
    assert shaper.limits == {(NETNS, "net1"): LIMIT}

    failing = FakeShaper(failing={("apply", "net1")})
    other = shaped_node(tmp_path / "b", failing)
    other.lifecycle.concurrent = True
    with pytest.raises(AttachError, match="rate limit 100Mbit/s on net1"):
        await other.hooks.run_pod_sandbox(pod("a"))
    assert sorted(c.if_name for c in other.plugins.commands("DEL")) == ["net1", "net2"]
    assert other.store.get("a-sandbox") is None
