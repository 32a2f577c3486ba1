"""Issue 44 while pods run (cnidra.nri.bandwidth.BandwidthKeeper, with the hook as the driver
wires it and a fake shaper): a DeviceClass's changed bandwidth rules reach its running pods'
interfaces (the grant itself cannot change: Kubernetes refuses a change to a claim's
allocation); under `whenUnreserved: Leftover` an unreserved interface gets, at its ADD and
then as reservations on its link come and go, an even share of what they leave; a limit that
cannot be changed is kept and tried again; records from before the terms are left alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest

from cnidra.api.bandwidth import DEFAULT_RULES, BandwidthRules, Rate, Terms, leftover_share
from cnidra.api.constants import API_VERSION, CONDITION_BANDWIDTH, DRIVER_NAME
from cnidra.kube.api import Api
from cnidra.kube.deviceclasses import follow_device_classes
from cnidra.nri.bandwidth import DEFAULT_PERIOD, SYNC_GRACE_SECONDS, BandwidthKeeper
from tests.nri.fakes import FakeShaper, Node, network, pod, prepare

M = 10**6
LINK = 1000 * M
PARENT = "eth1"


def rate(mbps: int, ceil: int | None = None) -> Rate:
    return Rate(mbps * M, (ceil or mbps) * M)


def rules(**fields: Any) -> BandwidthRules:
    return BandwidthRules.model_validate(fields)


def device_class(name: str, **bandwidth: Any) -> dict[str, Any]:
    policy: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "CNIPolicy"}
    if bandwidth:
        policy["bandwidth"] = bandwidth
    return {
        "metadata": {"name": name},
        "spec": {"config": [{"opaque": {"driver": DRIVER_NAME, "parameters": policy}}]},
    }


def claimed(
    node: Node,
    name: str,
    granted_mbps: int | None,
    *,
    klass: str = "gold",
    class_rules: BandwidthRules = DEFAULT_RULES,
    parent: str = PARENT,
) -> None:
    """A claim of pod `name` for one macvlan interface (net1) on `parent`."""
    terms = Terms(None if granted_mbps is None else granted_mbps * M, LINK, class_rules, klass)
    prepare(
        node.checkpoint,
        name,
        f"{name}-uid",
        ("net1", network(name, "macvlan")),
        bandwidth=terms,
        parent=parent,
    )


def keeper(node: Node) -> BandwidthKeeper:
    assert node.keeper is not None
    return node.keeper


def held(shaper: FakeShaper, name: str) -> Rate | None:
    return shaper.limits.get((f"/run/netns/{name}-sandbox", "net1"))


def recorded(node: Node, name: str) -> Rate | None:
    record = node.store.get(f"{name}-sandbox")
    assert record is not None
    [attached] = record.attachments
    return attached.attachment.rate


def condition(node: Node, name: str) -> str | None:
    [entry] = next(v for c, v in node.status.entries.items() if c.name == name).values()
    found = [c for c in entry["conditions"] if c["type"] == CONDITION_BANDWIDTH]
    return found[0]["message"] if found else None


async def start(node: Node, *names: str) -> None:
    for name in names:
        await node.hooks.run_pod_sandbox(pod(name))


async def test_a_classes_changed_rules_reach_its_running_pods(tmp_path: Path) -> None:
    shaper = FakeShaper()
    node = Node.start(tmp_path, shaper=shaper, bandwidth=True)
    claimed(node, "r", 400)  # reserved 400M; the class as allocated: no bursts
    claimed(node, "u", None, klass="bronze", class_rules=rules(whenUnreserved="Unlimited"))
    await start(node, "r", "u")
    assert (held(shaper, "r"), held(shaper, "u")) == (rate(400), None)
    k = keeper(node)
    k.replace_classes([device_class("gold"), device_class("bronze", whenUnreserved="Unlimited")])
    assert await k.reconcile() == 0  # as allocated: nothing to do

    # the admin lets gold's claims burst, and holds bronze's unreserved ones to 50M
    k.class_changed("MODIFIED", device_class("gold", burst="Allowed", burstCeiling="800M"))
    k.class_changed("MODIFIED", device_class("bronze", whenUnreserved="50M"))
    assert await k.reconcile() == 2
    assert (held(shaper, "r"), held(shaper, "u")) == (rate(400, 800), rate(50))
    assert (recorded(node, "r"), recorded(node, "u")) == (rate(400, 800), rate(50))
    assert condition(node, "r") == (
        "net1 is held to 400Mbit/s in each direction, bursting to 800Mbit/s while the link has room"
    )
    assert condition(node, "u") == "net1 is held to 50Mbit/s in each direction"

    # bronze back to Unlimited: the limit goes; gold deleted: the allocation's copy again
    k.class_changed("MODIFIED", device_class("bronze", whenUnreserved="Unlimited"))
    k.class_changed("DELETED", device_class("gold"))
    assert await k.reconcile() == 2
    assert (held(shaper, "r"), held(shaper, "u")) == (rate(400), None)
    assert condition(node, "u") is None
    assert [c[0] for c in shaper.calls if c[1].endswith("u-sandbox")] == ["apply", "remove"]

    # a restarted driver reads the limits the keeper wrote, and the hook of a new sandbox of
    # the class applies the class's rules as last watched
    k.class_changed("ADDED", device_class("gold", whenUnreserved="10M", burst="Allowed"))
    await k.reconcile()
    assert recorded(Node.start(tmp_path, bandwidth=True), "r") == rate(400, 1000)


async def test_an_invalid_class_policy_leaves_the_limits_as_they_are(tmp_path: Path) -> None:
    shaper = FakeShaper()
    node = Node.start(tmp_path, shaper=shaper, bandwidth=True)
    claimed(node, "r", 400)
    await start(node, "r")
    k = keeper(node)
    k.class_changed("ADDED", device_class("gold", burst="Allowed"))
    await k.reconcile()
    k.class_changed("MODIFIED", device_class("gold", burst="Sometimes"))
    assert k.classes["gold"] == rules(burst="Allowed")
    assert await k.reconcile() == 0 and held(shaper, "r") == rate(400, 1000)
    k.replace_classes([device_class("gold", whenUnreserved="fast")])  # a relist: the same
    assert k.classes["gold"] == rules(burst="Allowed")


async def test_unreserved_pods_share_what_the_reservations_on_their_link_leave(
    tmp_path: Path,
) -> None:
    """1G link: u1 alone gets all of it; r reserves 400M, so u1 gets 600M, from r's prepare
    on (before r's pod starts); u2 comes, each unreserved pod gets 300M; r goes, each gets
    500M. A pod on another link is not counted. The hook applies the share of the moment;
    the keeper gives the others theirs."""
    shaper = FakeShaper()
    node = Node.start(tmp_path, shaper=shaper, bandwidth=True)
    k = keeper(node)
    claimed(node, "u1", None)
    await start(node, "u1")
    assert held(shaper, "u1") == rate(1000)
    assert condition(node, "u1") == "net1 is held to 1Gbit/s in each direction"
    claimed(node, "r", 400)  # prepared: its pod is about to start
    claimed(node, "far", 900, parent="eth2")
    assert await k.reconcile() == 1
    assert held(shaper, "u1") == rate(600)
    await start(node, "r", "far")
    assert held(shaper, "r") == rate(400) and await k.reconcile() == 0  # counted once
    claimed(node, "u2", None)
    await start(node, "u2")
    assert held(shaper, "u2") == rate(300)  # at its ADD, u1 and r counted
    await k.reconcile()
    assert (held(shaper, "u1"), held(shaper, "u2")) == (rate(300), rate(300))
    assert (
        sum(shaper.limits[(f"/run/netns/{n}-sandbox", "net1")].ceil for n in ("r", "u1", "u2"))
        <= LINK
    )

    await node.hooks.stop_pod_sandbox(pod("r"))
    await node.hooks.remove_pod_sandbox(pod("r"))
    assert await k.reconcile() == 0  # reserved until kubelet unprepares the claim
    await node.checkpoint.remove("r-uid")  # NodeUnprepareResources
    await k.reconcile()
    assert (held(shaper, "u1"), held(shaper, "u2")) == (rate(500), rate(500))
    assert (recorded(node, "u1"), recorded(node, "u2")) == (rate(500), rate(500))
    assert held(shaper, "far") == rate(900)  # its own link: untouched throughout


async def test_a_reserved_pod_that_may_burst_borrows_only_what_nobody_reserved(
    tmp_path: Path,
) -> None:
    """1G link: r reserved 400M and its class lets it burst; u reserved nothing. What r's
    grant leaves, 600M, is shared by the two that take from it: u is held to 300M, r bursts
    to 700M, so together they never exceed the link, and neither eats the other's."""
    shaper = FakeShaper()
    node = Node.start(tmp_path, shaper=shaper, bandwidth=True)
    claimed(node, "r", 400, class_rules=rules(burst="Allowed"))
    claimed(node, "u", None)
    await start(node, "r", "u")
    await keeper(node).reconcile()
    assert (held(shaper, "r"), held(shaper, "u")) == (rate(400, 700), rate(300))
    assert condition(node, "r") == (
        "net1 is held to 400Mbit/s in each direction, bursting to 700Mbit/s while the link has room"
    )


async def test_a_limit_that_cannot_be_changed_is_kept_and_tried_again(tmp_path: Path) -> None:
    shaper = FakeShaper()
    node = Node.start(tmp_path, shaper=shaper, bandwidth=True)
    claimed(node, "u", None)
    await start(node, "u")
    claimed(node, "r", 400)
    await start(node, "r")
    shaper.failing.add(("apply", "net1"))
    k = keeper(node)
    assert await k.reconcile() == 0
    assert recorded(node, "u") == rate(1000)  # what the interface still holds
    shaper.failing.clear()
    assert await k.reconcile() == 1 and recorded(node, "u") == rate(600)


async def test_a_record_from_before_the_terms_keeps_its_rate(tmp_path: Path) -> None:
    shaper = FakeShaper()
    node = Node.start(tmp_path, shaper=shaper, bandwidth=True)
    prepare(node.checkpoint, "old", "old-uid", ("net1", network("old", "macvlan")), rate=rate(70))
    await start(node, "old")
    assert held(shaper, "old") == rate(70)
    keeper(node).class_changed("ADDED", device_class("gold", whenUnreserved="5M"))
    assert await keeper(node).reconcile() == 0 and held(shaper, "old") == rate(70)


async def test_a_pass_locks_only_the_sandboxes_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass (one each time interfaces come or go) takes the lock of, and does again, only a
    sandbox with an interface whose limit changes: not one without terms, not one whose
    limits hold (most of them on most passes)."""
    shaper = FakeShaper()
    node = Node.start(tmp_path, shaper=shaper, bandwidth=True)
    prepare(node.checkpoint, "old", "old-uid", ("net1", network("old", "macvlan")), rate=rate(70))
    claimed(node, "r", 400)
    await start(node, "old", "r")
    k = keeper(node)
    held_ids: list[str] = []
    hold = k.locks.hold

    def counting(key: str, wait: float | None = None) -> Any:
        held_ids.append(key)
        return hold(key, wait)

    monkeypatch.setattr(k.locks, "hold", counting)
    k.class_changed("MODIFIED", device_class("gold", burst="Allowed", burstCeiling="800M"))
    assert await k.reconcile() == 1
    assert held_ids == ["r-sandbox"] and held(shaper, "r") == rate(400, 800)
    held_ids.clear()
    k.changed()  # interfaces came or went elsewhere: nothing of these changes
    assert await k.reconcile() == 0 and held_ids == []


async def test_the_keeper_runs_when_told(tmp_path: Path) -> None:
    shaper = FakeShaper()
    node = Node.start(tmp_path, shaper=shaper, bandwidth=True)
    claimed(node, "u", None)
    await start(node, "u")
    k = keeper(node)
    k.period = 3600.0  # only word wakes it
    task = asyncio.create_task(k.run())
    try:
        claimed(node, "r", 400)
        await start(node, "r")  # the hook tells it
        for _ in range(3000):  # 30 s: a hang's bound
            if held(shaper, "u") == rate(600):
                break
            await asyncio.sleep(0.01)
        assert held(shaper, "u") == rate(600)
    finally:
        task.cancel()


class FakeClasses:
    """The apiserver as follow_device_classes sees it: one LIST, then a watch that says what
    it was given and then waits."""

    def __init__(self, listed: list[dict[str, Any]], events: list[tuple[str, dict[str, Any]]]):
        self.listed = listed
        self.events = events

    async def list(self, kind: Any, **_: Any) -> list[dict[str, Any]]:
        assert kind.kind == "DeviceClass"
        return self.listed

    async def watch(self, kind: Any, **_: Any) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        for event in self.events:
            yield event
        await asyncio.Event().wait()


async def test_the_classes_are_listed_then_watched_into_the_keeper(tmp_path: Path) -> None:
    node = Node.start(tmp_path, bandwidth=True)
    k = keeper(node)
    assert k.period == DEFAULT_PERIOD == 30.0  # docs/configuration.md: "every 30 s"
    api = FakeClasses(
        [device_class("gold"), device_class("bronze", whenUnreserved="5M")],
        [
            ("MODIFIED", device_class("gold", burst="Allowed")),
            ("DELETED", device_class("bronze")),
        ],
    )
    task = asyncio.create_task(follow_device_classes(cast(Api, api), k))
    try:
        for _ in range(3000):  # 30 s: a hang's bound
            if k.classes == {"gold": rules(burst="Allowed")}:
                break
            await asyncio.sleep(0.01)
        assert k.classes == {"gold": rules(burst="Allowed")}
    finally:
        task.cancel()


async def test_no_pass_before_the_classes_were_listed_or_a_grace(tmp_path: Path) -> None:
    """A restarted driver does not take its interfaces back to the allocations' rules before
    it has read the classes' (then forward again); without classes, after the grace, it
    goes on with the allocations'."""
    shaper = FakeShaper()
    node = Node.start(tmp_path, shaper=shaper, bandwidth=True)
    claimed(node, "u", None)
    await start(node, "u")
    claimed(node, "r", 400)
    await start(node, "r")
    now = [0.0]
    fresh = BandwidthKeeper(
        node.store,
        node.status,
        node.lifecycle.locks,
        shaper=shaper,
        clock=lambda: now[0],
        checkpoint=node.checkpoint,
    )
    assert await fresh.reconcile() == 0 and held(shaper, "u") == rate(1000)
    now[0] = SYNC_GRACE_SECONDS + 1
    assert await fresh.reconcile() == 1 and held(shaper, "u") == rate(600)


def test_the_documented_shares() -> None:
    """docs/configuration.md, `Leftover`: a 10 Gbit/s link with 100M and 400M reserved holds
    one unreserved pod to 9.5 Gbit/s, two to 4.75 each; two alone on it get 5G each."""
    link, reserved = 10_000 * M, 500 * M
    assert leftover_share(link, reserved, 1) == 9_500 * M
    assert leftover_share(link, reserved, 2) == 4_750 * M
    assert leftover_share(link, 0, 2) == 5_000 * M  # two alone on the link: 5G each
