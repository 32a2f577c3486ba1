"""cnidra touches only what its own records say it added, and a pod's hook fits the runtime's
timeout. The pod lifecycle with fake plugins: milliseconds, no namespaces."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from cnidra.cni.result import Result
from cnidra.cni.types import RuntimeConf
from cnidra.nri.lifecycle import AttachError, HookBudget
from cnidra.state.sandboxes import State
from tests.nri.fakes import FakePlugins, Node, network, pod, prepare


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node.start(tmp_path)


@pytest.fixture
def plugins(node: Node) -> FakePlugins:
    return node.plugins


def foreign_cache_entry(node: Node, network: str, container: str, if_name: str) -> None:
    """What another CNI user (containerd's primary network, cnitool) leaves in a cache."""
    conf = {"cniVersion": "1.1.0", "name": network, "plugins": [{"type": "bridge"}]}
    node.lifecycle.runtime.cache.store(
        network,
        RuntimeConf(container, f"/run/netns/{container}", if_name),
        json.dumps(conf).encode(),
        Result({"cniVersion": "1.1.0", "ips": []}),
    )


async def test_synchronize_never_deletes_what_only_a_cache_knows(
    node: Node, plugins: FakePlugins
) -> None:
    # the primary network's entries, and even one named like an owned network, with no record
    foreign_cache_entry(node, "k8s-pod-network", "primary-pod", "eth0")
    foreign_cache_entry(node, "cnidra-ns.ns.data", "orphan", "net1")
    prepare(node.checkpoint, "c", "a-uid", ("net1", network("data", "macvlan")))
    await node.hooks.run_pod_sandbox(pod("a"))
    plugins.calls.clear()

    await node.hooks.synchronize([pod("a")])

    assert plugins.commands("DEL") == []
    # GC is the plugins' own, for the owned network only, with the recorded attachment valid
    assert [(c.plugin, c.network) for c in plugins.commands("GC")] == [
        ("macvlan", "cnidra-ns.ns.data")
    ]
    cached = {(e.network, e.container_id) for e in node.lifecycle.runtime.cache.attachments()}
    assert ("k8s-pod-network", "primary-pod") in cached and (
        "cnidra-ns.ns.data",
        "orphan",
    ) in cached


async def test_a_vanished_sandbox_is_undone_from_its_record_with_its_own_config(
    node: Node, plugins: FakePlugins
) -> None:
    prepare(node.checkpoint, "c", "a-uid", ("net1", network("data", "macvlan", "tuning")))
    await node.hooks.run_pod_sandbox(pod("a"))
    plugins.calls.clear()

    await node.hooks.synchronize([])  # the runtime no longer has the sandbox

    assert [(c.plugin, c.container_id, c.if_name, c.network) for c in plugins.commands("DEL")] == [
        ("tuning", "a-sandbox", "net1", "cnidra-ns.ns.data"),
        ("macvlan", "a-sandbox", "net1", "cnidra-ns.ns.data"),
    ]
    assert len(node.store) == 0 and not list(node.lifecycle.runtime.cache.attachments())


async def test_a_slow_plugin_fails_the_sandbox_inside_the_budget_and_leaves_nothing(
    node: Node, plugins: FakePlugins
) -> None:
    plugins.slow["sleepy"] = 5.0
    prepare(
        node.checkpoint,
        "c",
        "a-uid",
        ("net1", network("fast", "macvlan")),
        ("net2", network("slow", "macvlan", "sleepy")),
    )
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(AttachError) as info:
        await node.hooks.run_pod_sandbox(pod("a"))
    assert loop.time() - start < 0.9  # the runtime's timeout is 1.0 s
    message = str(info.value)
    assert "'sleepy'" in message and "the pod's attach budget of 0.3s" in message
    assert "request req1 (net2)" in message
    # both attachments DELed, the slow one included, in reverse order
    assert [(c.if_name, c.plugin) for c in plugins.commands("DEL")] == [
        ("net2", "sleepy"),
        ("net2", "macvlan"),
        ("net1", "macvlan"),
    ]
    assert len(node.store) == 0 and not list(node.lifecycle.runtime.cache.attachments())


async def test_a_cancelled_hook_is_rolled_back_from_its_record(
    node: Node, plugins: FakePlugins
) -> None:
    node.lifecycle.budget = HookBudget(attach=5.0, request_timeout=10.0)
    plugins.slow["sleepy"] = 5.0
    prepare(
        node.checkpoint,
        "c",
        "a-uid",
        ("net1", network("fast", "macvlan")),
        ("net2", network("slow", "sleepy")),
    )
    hook = asyncio.create_task(node.hooks.run_pod_sandbox(pod("a")))
    for _ in range(3000):  # until the slow plugin runs (not a fixed 50 ms: a loaded machine)
        if plugins.commands("ADD") and plugins.commands("ADD")[-1].plugin == "sleepy":
            break
        await asyncio.sleep(0.01)
    assert node.store.get("a-sandbox").state is State.ADDING  # type: ignore[union-attr]
    hook.cancel()
    with pytest.raises(asyncio.CancelledError):
        await hook
    for _ in range(3000):
        if len(node.store) == 0:
            break
        await asyncio.sleep(0.01)
    assert len(node.store) == 0 and not list(node.lifecycle.runtime.cache.attachments())
    assert {(c.if_name, c.plugin) for c in plugins.commands("DEL")} == {
        ("net1", "macvlan"),
        ("net2", "sleepy"),
    }


async def test_more_attachments_than_the_limit_fail_before_any_plugin_runs(
    node: Node, plugins: FakePlugins
) -> None:
    nets = [(f"net{i}", network(f"n{i}", "macvlan")) for i in range(4)]
    prepare(node.checkpoint, "c", "a-uid", *nets)
    with pytest.raises(AttachError, match="4 cnidra interfaces; at most 3 per pod"):
        await node.hooks.run_pod_sandbox(pod("a"))
    assert plugins.calls == [] and len(node.store) == 0


def test_the_budget_fits_the_runtimes_timeout() -> None:
    assert HookBudget().attach_seconds == pytest.approx(1.2)  # containerd's default 2 s
    assert HookBudget().answer_seconds == pytest.approx(1.8)
    assert HookBudget(attach=0.5).attach_seconds == 0.5
    assert HookBudget(attach=30, request_timeout=2).attach_seconds == pytest.approx(1.8)
