"""ADDs behind the sandbox (the driver's default): RunPodSandbox answers before any plugin
runs, the pod's first CreateContainer waits for its interfaces, pods' ADDs overlap, a failure
fails the container (and the next try attaches again), and a sandbox stopped mid-ADD is
DELed after the ADDs, never before.

What a hook does while a plugin runs is judged with plugins held until the test releases them
(`Held`), not by how long a fake's sleep took: on a loaded machine a 0.1 s ADD can end before
the hook that should answer first has run, and 50 ms of wall time is no bound. The hook
budgets are the product's; a test that does not exercise one gives it room a loaded machine
does not reach."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cnidra.cni.errors import PluginTimeout
from cnidra.nri.lifecycle import AttachError, HookBudget
from cnidra.state.sandboxes import State
from tests.nri.fakes import FakePlugins, Node, network, pod, prepare


def one_network(node: Node, name: str) -> None:
    prepare(node.checkpoint, f"c-{name}", f"{name}-uid", ("net1", network(f"n-{name}", "macvlan")))


# no hook deadline a loaded machine reaches: ADDs behind the sandbox may take 60 s, a
# CreateContainer waits for them 54 s (90 % of the runtime's 60 s)
ROOMY = HookBudget(request_timeout=60.0, behind=60.0)


@dataclass
class Held(FakePlugins):
    """`held` commands ("ADD", "DEL") run until `release` is set, or until their deadline
    passes (a PluginTimeout, as the real exec's): the call is recorded first."""

    held: str = "ADD"
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(
        self, plugin_type: str, invocation: Any, stdin: bytes, deadline: Any = None
    ) -> Any:
        result = await super().run(plugin_type, invocation, stdin, deadline)
        if invocation.command in self.held:
            limit = self.timeout if deadline is None else min(self.timeout, deadline.remaining())
            try:
                await asyncio.wait_for(self.release.wait(), max(limit, 0))
            except TimeoutError:
                raise PluginTimeout(
                    plugin_type, invocation.command, limit, deadline.describe() if deadline else ""
                ) from None
        return result


def waiting(node: Node, sandbox_id: str) -> int:
    """How many hold or wait for the sandbox's lock."""
    return node.lifecycle.locks._locks.get(sandbox_id, (None, 0))[1]


async def until(check: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not {what} in {seconds:g} s")


async def test_the_sandbox_hook_answers_before_the_plugins_and_containers_wait(
    tmp_path: Path,
) -> None:
    """Still catches a RunPodSandbox that waits for the ADDs (it would hang on the held ADD)
    and a CreateContainer that does not (it would end while the ADD is held)."""
    plugins = Held()
    node = Node.start(tmp_path, plugins, background=True)
    node.lifecycle.budget = ROOMY
    one_network(node, "a")
    await asyncio.wait_for(node.hooks.run_pod_sandbox(pod("a")), 30)  # the ADD held meanwhile
    await adding(node)
    container = asyncio.create_task(node.hooks.create_container(pod("a")))
    done, _ = await asyncio.wait({container}, timeout=0.2)
    assert not done, "the container did not wait for its pod's ADD"
    plugins.release.set()
    await asyncio.wait_for(container, 30)
    record = node.store.get("a-sandbox")
    assert record is not None and record.state is State.ADDED
    await node.hooks.create_container(pod("a"))  # the next container: nothing to wait for
    assert len(node.plugins.commands("ADD")) == 1


async def test_a_burst_of_pods_adds_side_by_side(tmp_path: Path) -> None:
    """What containerd's one NRI lock serialises when the ADDs run inside RunPodSandbox: all
    ten ADDs are under way at once while none may finish (ADDs one at a time, or inside the
    hook, never start the second)."""
    plugins = Held()
    node = Node.start(tmp_path, plugins, background=True)
    node.lifecycle.budget = ROOMY
    names = [f"p{i}" for i in range(10)]
    for name in names:
        one_network(node, name)
    for name in names:  # the runtime calls the hooks one at a time
        await asyncio.wait_for(node.hooks.run_pod_sandbox(pod(name)), 30)
    await until(lambda: len(plugins.commands("ADD")) == len(names), "ten ADDs at once")
    plugins.release.set()
    for name in names:
        await asyncio.wait_for(node.hooks.create_container(pod(name)), 30)
    assert all(
        (r := node.store.get(f"{name}-sandbox")) is not None and r.state is State.ADDED
        for name in names
    )


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
    # room for the ADD's 0.1 s: 0.3 s of budget less a loaded machine's delay is not
    node.lifecycle.budget = ROOMY
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
    done again (in the sandbox hook the same plugin fails the sandbox: test_ownership). The
    ADD is held until the first CreateContainer has given up, past the hook's 0.6 s share."""
    plugins = Held()
    node = Node.start(tmp_path, plugins, background=True)
    node.lifecycle.budget = HookBudget(request_timeout=1.0, behind=60.0)
    one_network(node, "a")
    await node.hooks.run_pod_sandbox(pod("a"))
    await adding(node)
    with pytest.raises(AttachError, match="still being set up"):
        await node.hooks.create_container(pod("a"))
    plugins.release.set()  # the ADD ends, after the 0.9 s the hook waited
    await asyncio.wait_for(node.hooks.create_container(pod("a")), 30)  # kubelet's next try
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
    # room for the ADD's 0.15 s: 0.3 s of budget less a loaded machine's delay is not
    node.lifecycle.budget = ROOMY
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
    DELs what the record lists, in time: before its deadline (90 % of the runtime's 10 s
    here), else the detach would have gone to a retry and no DEL be done when it answers."""
    node = Node.start(tmp_path, Held(), background=True)  # an ADD held for its 120 s
    node.lifecycle.budget = HookBudget(request_timeout=10.0, behind=120.0)
    one_network(node, "a")
    await node.hooks.run_pod_sandbox(pod("a"))
    await adding(node)  # the ADD is running
    await asyncio.wait_for(node.hooks.stop_pod_sandbox(pod("a")), 30)
    assert not node.lifecycle.detaches  # done in the hook, not handed on at its deadline
    assert [c.command for c in node.plugins.calls] == ["ADD", "DEL"]
    assert node.store.get("a-sandbox") is None
    await node.hooks.remove_pod_sandbox(pod("a"))
    await asyncio.sleep(0.05)  # the cancelled ADD's rollback finds nothing left, and ends
    assert node.store.get("a-sandbox") is None and not node.lifecycle.detaches
    assert [c.command for c in node.plugins.calls] == ["ADD", "DEL"]


async def adding(node: Node) -> None:
    """Until the fake plugin has been called for ADD (and sleeps its `slow` seconds)."""
    for _ in range(6000):
        if any(c.command == "ADD" for c in node.plugins.calls):
            return
        await asyncio.sleep(0.005)
    raise AssertionError("no ADD started in 30 s")


async def test_a_stop_behind_a_reconnects_detach_still_answers_in_time(tmp_path: Path) -> None:
    """NRI reconnects mid-ADD: Synchronize's detach waits for the sandbox's lock first, then
    the sandbox is stopped. The lock goes to Synchronize, whose DELs are slow: the Stop hook
    hands its detach to a retry at its deadline instead of waiting past the runtime's. Its
    DEL is held until the Stop hook has answered: a hook that waited for it never would."""
    plugins = Held(held="DEL", slow={"macvlan": 5.0})
    node = Node.start(tmp_path, plugins, background=True)
    node.lifecycle.budget = HookBudget(request_timeout=1.0, behind=10.0)
    one_network(node, "a")
    await node.hooks.run_pod_sandbox(pod("a"))
    await adding(node)  # the ADD is running, the lock held
    sync = asyncio.create_task(node.hooks.synchronize([pod("a")]))
    await until(lambda: waiting(node, "a-sandbox") >= 2, "Synchronize waiting for the lock")
    await asyncio.wait_for(node.hooks.stop_pod_sandbox(pod("a")), 30)
    assert "a-sandbox" in node.lifecycle.detaches  # handed on at its deadline
    plugins.release.set()
    await asyncio.wait_for(sync, 30)
    await node.hooks.remove_pod_sandbox(pod("a"))
    await node.settle()
    assert node.store.get("a-sandbox") is None and not node.lifecycle.detaches
    assert not node.lifecycle.stopped


async def test_a_sandbox_stopped_during_a_synchronize_is_not_attached_by_it(
    tmp_path: Path,
) -> None:
    """Synchronize's list of pods goes old while it waits for a pod's lock (an ADD in
    flight): a sandbox stopped meanwhile has no record, and must not be attached by it."""
    node = Node.start(tmp_path, FakePlugins(slow={"macvlan": 0.2}), background=True)
    # room for the ADD's 0.2 s: 0.3 s of budget less a loaded machine's delay is not
    node.lifecycle.budget = ROOMY
    for name in ("a", "b"):
        one_network(node, name)
    await node.hooks.run_pod_sandbox(pod("b"))
    await node.hooks.create_container(pod("b"))  # b attached
    await node.hooks.run_pod_sandbox(pod("a"))
    await adding(node)  # a's ADD is running
    sync = asyncio.create_task(node.hooks.synchronize([pod("a"), pod("b")]))
    await until(lambda: waiting(node, "a-sandbox") >= 2, "Synchronize waiting for a's lock")
    await node.hooks.stop_pod_sandbox(pod("b"))
    assert node.store.get("b-sandbox") is None
    await sync
    assert node.store.get("b-sandbox") is None
    await node.hooks.remove_pod_sandbox(pod("b"))
    assert "b-sandbox" not in node.lifecycle.stopped
