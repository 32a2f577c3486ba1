"""ADDs behind the sandbox (the driver's default): RunPodSandbox answers before any plugin
runs, the pod's first CreateContainer waits for its interfaces, pods' ADDs overlap, a failure
fails the container (and the next try attaches again), and a sandbox stopped mid-ADD is
DELed after the ADDs, never before."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cnidra.cni.errors import PluginTimeout
from cnidra.nri.lifecycle import AttachError, HookBudget
from cnidra.state.sandboxes import State
from tests.nri.fakes import FakePlugins, Node, network, pod, prepare


def one_network(node: Node, name: str) -> None:
    prepare(node.checkpoint, f"c-{name}", f"{name}-uid", ("net1", network(f"n-{name}", "macvlan")))


async def test_the_sandbox_hook_answers_before_the_plugins_and_containers_wait(
    tmp_path: Path,
) -> None:
    node = Node.start(tmp_path, FakePlugins(slow={"macvlan": 0.1}), background=True)
    one_network(node, "a")
    start = time.perf_counter()
    await node.hooks.run_pod_sandbox(pod("a"))
    assert time.perf_counter() - start < 0.05
    await node.hooks.create_container(pod("a"))
    assert time.perf_counter() - start >= 0.1
    record = node.store.get("a-sandbox")
    assert record is not None and record.state is State.ADDED
    await node.hooks.create_container(pod("a"))  # the next container: nothing to wait for
    assert len(node.plugins.commands("ADD")) == 1


async def test_a_burst_of_pods_adds_side_by_side(tmp_path: Path) -> None:
    """What containerd's one NRI lock serialises when the ADDs run inside RunPodSandbox."""
    node = Node.start(tmp_path, FakePlugins(slow={"macvlan": 0.1}), background=True)
    names = [f"p{i}" for i in range(10)]
    for name in names:
        one_network(node, name)
    start = time.perf_counter()
    for name in names:  # the runtime calls the hooks one at a time
        await node.hooks.run_pod_sandbox(pod(name))
    for name in names:
        await node.hooks.create_container(pod(name))
    assert time.perf_counter() - start < 0.5  # in the hook: 10 x 0.1 s


async def test_a_failed_add_fails_the_container_and_the_next_try_attaches_again(
    tmp_path: Path,
) -> None:
    plugins = FakePlugins(failing={"macvlan": "ADD"})
    node = Node.start(tmp_path, plugins, background=True)
    one_network(node, "a")
    await node.hooks.run_pod_sandbox(pod("a"))  # answers: the failure is the container's
    with pytest.raises(AttachError, match="it broke"):
        await node.hooks.create_container(pod("a"))
    assert node.store.get("a-sandbox") is None  # rolled back
    plugins.failing.clear()
    await node.hooks.create_container(pod("a"))  # kubelet's next try
    record = node.store.get("a-sandbox")
    assert record is not None and record.state is State.ADDED


async def test_a_sandbox_stopped_mid_add_is_deleted_after_it(tmp_path: Path) -> None:
    node = Node.start(tmp_path, FakePlugins(slow={"macvlan": 0.1}), background=True)
    one_network(node, "a")
    await node.hooks.run_pod_sandbox(pod("a"))
    await adding(node)  # the ADD is running
    await node.hooks.stop_pod_sandbox(pod("a"))
    commands = [c.command for c in node.plugins.calls]
    assert commands == ["ADD", "DEL"]
    assert node.store.get("a-sandbox") is None


async def test_pods_without_cnidra_claims_are_not_waited_for(tmp_path: Path) -> None:
    node = Node.start(tmp_path, background=True)
    await node.hooks.run_pod_sandbox(pod("plain"))
    await node.hooks.create_container(pod("plain"))
    assert node.plugins.calls == []


async def test_behind_the_sandbox_a_slow_add_is_not_killed_at_the_hooks_budget(
    tmp_path: Path,
) -> None:
    """A node slowed by a burst: the ADD outlasts what one hook may wait (0.9 s of the fake
    runtime's 1 s), so the first CreateContainer fails and kubelet's next try finds it done.
    The ADD had the plugin timeout, not the hook's 1.2 s share, so it was never killed and
    done again (in the sandbox hook the same plugin fails the sandbox: test_ownership)."""
    node = Node.start(tmp_path, FakePlugins(slow={"macvlan": 1.2}), background=True)
    node.lifecycle.budget = HookBudget(request_timeout=1.0, behind=5.0)
    one_network(node, "a")
    await node.hooks.run_pod_sandbox(pod("a"))
    with pytest.raises(AttachError, match="still being set up"):
        await node.hooks.create_container(pod("a"))
    await node.hooks.create_container(pod("a"))  # kubelet's next try
    record = node.store.get("a-sandbox")
    assert record is not None and record.state is State.ADDED
    assert [c.command for c in node.plugins.calls] == ["ADD"]  # once, never killed or undone


def test_the_budget_behind_the_sandbox() -> None:
    assert HookBudget(behind=10).behind_seconds == 10  # the plugin timeout, by default
    assert HookBudget(attach=3, behind=10).behind_seconds == 3  # --attach-budget when set
    assert HookBudget(attach=30, behind=10).behind_seconds == 30  # no hook's timeout caps it


async def test_a_reconnect_mid_add_leaves_the_add_alone(tmp_path: Path) -> None:
    """NRI reconnects (containerd dropped a starved driver) while a pod's ADDs run behind its
    sandbox: Synchronize reads the record as `adding`, which a crash would also leave. It
    waits for the sandbox's lock and finds the ADDs done, so it leaves them: undoing them
    then would take net1 from a container the gate had just let start (the starved-driver
    test on the test bed saw one run bare for 10 s that way)."""
    node = Node.start(tmp_path, FakePlugins(slow={"macvlan": 0.15}), background=True)
    one_network(node, "a")
    await node.hooks.run_pod_sandbox(pod("a"))
    await adding(node)  # the ADD is running
    record = node.store.get("a-sandbox")
    assert record is not None and record.state is State.ADDING
    await node.hooks.synchronize([pod("a")])
    await node.hooks.create_container(pod("a"))
    record = node.store.get("a-sandbox")
    assert record is not None and record.state is State.ADDED
    assert [c.command for c in node.plugins.calls if c.command in ("ADD", "DEL")] == ["ADD"]


async def test_a_crash_mid_add_is_still_undone_at_synchronize(tmp_path: Path) -> None:
    """The other `adding`: a record left by a process that died mid-ADD (no ADD in flight
    here) is undone, and the live pod attached again."""
    node = Node.start(tmp_path, background=True)
    one_network(node, "a")
    await node.hooks.run_pod_sandbox(pod("a"))
    await node.hooks.create_container(pod("a"))
    record = node.store.get("a-sandbox")
    assert record is not None
    await node.store.put(record.with_state(State.ADDING))  # as a crash mid-ADD leaves it
    node.plugins.calls.clear()
    await node.hooks.synchronize([pod("a")])
    assert [c.command for c in node.plugins.calls if c.command in ("ADD", "DEL")] == [
        "DEL",
        "ADD",
    ]
    record = node.store.get("a-sandbox")
    assert record is not None and record.state is State.ADDED


async def test_a_sandbox_stopped_during_a_long_add_answers_within_the_hooks_time(
    tmp_path: Path,
) -> None:
    """ADDs behind the sandbox may take the plugin timeout, longer than the runtime waits for
    a hook: StopPodSandbox cancels them (the plugin killed) instead of waiting for them, and
    DELs what the record lists, in time."""
    node = Node.start(tmp_path, FakePlugins(slow={"macvlan": 5.0}), background=True)
    node.lifecycle.budget = HookBudget(request_timeout=1.0, behind=10.0)
    one_network(node, "a")
    await node.hooks.run_pod_sandbox(pod("a"))
    await adding(node)  # the ADD is running
    start = time.perf_counter()
    await node.hooks.stop_pod_sandbox(pod("a"))
    assert time.perf_counter() - start < 0.9  # the fake runtime's hook timeout is 1 s
    assert [c.command for c in node.plugins.calls] == ["ADD", "DEL"]
    assert node.store.get("a-sandbox") is None
    await node.hooks.remove_pod_sandbox(pod("a"))
    await asyncio.sleep(0.05)  # the cancelled ADD's rollback finds nothing left, and ends
    assert node.store.get("a-sandbox") is None and not node.lifecycle.retries
    assert [c.command for c in node.plugins.calls] == ["ADD", "DEL"]


async def adding(node: Node) -> None:
    """Until the fake plugin has been called for ADD (and sleeps its `slow` seconds)."""
    for _ in range(1000):
        if any(c.command == "ADD" for c in node.plugins.calls):
            return
        await asyncio.sleep(0.005)
    raise AssertionError("no ADD started in 5 s")


@dataclass
class SlowDel(FakePlugins):
    """DEL takes `del_s`, within its deadline as the real exec does."""

    del_s: float = 0.0

    async def run(
        self, plugin_type: str, invocation: Any, stdin: bytes, deadline: Any = None
    ) -> Any:
        if invocation.command == "DEL" and self.del_s:
            limit = self.timeout if deadline is None else min(self.timeout, deadline.remaining())
            await asyncio.sleep(min(limit, self.del_s))
            if limit < self.del_s:
                raise PluginTimeout(plugin_type, "DEL", limit, "")
        return await super().run(plugin_type, invocation, stdin, deadline)


async def test_a_stop_behind_a_reconnects_detach_still_answers_in_time(tmp_path: Path) -> None:
    """NRI reconnects mid-ADD: Synchronize's detach waits for the sandbox's lock first, then
    the sandbox is stopped. The lock goes to Synchronize, whose DELs are slow: the Stop hook
    hands its detach to a retry at its deadline instead of waiting past the runtime's."""
    plugins = SlowDel(slow={"macvlan": 5.0}, del_s=1.5)
    node = Node.start(tmp_path, plugins, background=True)
    node.lifecycle.budget = HookBudget(request_timeout=1.0, behind=10.0)
    one_network(node, "a")
    await node.hooks.run_pod_sandbox(pod("a"))
    await adding(node)  # the ADD is running, the lock held
    sync = asyncio.create_task(node.hooks.synchronize([pod("a")]))
    await asyncio.sleep(0.05)  # Synchronize waits for the lock
    start = time.perf_counter()
    await node.hooks.stop_pod_sandbox(pod("a"))
    assert time.perf_counter() - start < 0.95
    await sync
    await node.hooks.remove_pod_sandbox(pod("a"))
    await node.settle()
    assert node.store.get("a-sandbox") is None and not node.lifecycle.retries
    assert not node.lifecycle.stopped


async def test_a_sandbox_stopped_during_a_synchronize_is_not_attached_by_it(
    tmp_path: Path,
) -> None:
    """Synchronize's list of pods goes old while it waits for a pod's lock (an ADD in
    flight): a sandbox stopped meanwhile has no record, and must not be attached by it."""
    node = Node.start(tmp_path, FakePlugins(slow={"macvlan": 0.2}), background=True)
    for name in ("a", "b"):
        one_network(node, name)
    await node.hooks.run_pod_sandbox(pod("b"))
    await node.hooks.create_container(pod("b"))  # b attached
    await node.hooks.run_pod_sandbox(pod("a"))
    await adding(node)  # a's ADD is running
    sync = asyncio.create_task(node.hooks.synchronize([pod("a"), pod("b")]))
    await asyncio.sleep(0.02)
    await node.hooks.stop_pod_sandbox(pod("b"))
    assert node.store.get("b-sandbox") is None
    await sync
    assert node.store.get("b-sandbox") is None
    await node.hooks.remove_pod_sandbox(pod("b"))
    assert "b-sandbox" not in node.lifecycle.stopped
