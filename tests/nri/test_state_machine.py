"""The pod state machine in milliseconds: a fake runtime and the real record store, a crash
after every write-ahead state, retries with backoff, shared claims, the sweeper, and state that
stays bounded however many pods come and go."""

from __future__ import annotations

from pathlib import Path

import pytest

from cnidra.state.sandboxes import State
from tests.nri.fakes import NODE_PAUSE_PID, Crash, FakePlugins, Node, network, pod, prepare


def two_networks(node: Node, pod_uid: str = "a-uid", claim: str = "c") -> None:
    prepare(
        node.checkpoint,
        claim,
        pod_uid,
        ("net1", network("one", "macvlan")),
        ("net2", network("two", "bridge", "tuning")),
    )


async def test_a_crash_after_added_keeps_the_interfaces_of_a_live_pod(tmp_path: Path) -> None:
    node = Node.start(tmp_path)
    two_networks(node)
    await node.hooks.run_pod_sandbox(pod("a"))

    again = Node.start(tmp_path)
    await again.hooks.synchronize([pod("a")])

    assert again.plugins.commands("DEL") == [] and again.plugins.commands("ADD") == []
    again.lifecycle.restore_status()
    [claim] = again.status.entries
    assert len(again.status.entries[claim]) == 2  # status re-derived from the records


@pytest.mark.parametrize("n", [1, 2, 3])  # every plugin call of the pod's ADD
async def test_a_crash_at_every_add_converges_to_one_attachment(tmp_path: Path, n: int) -> None:
    """Wherever the process dies among the pod's ADDs, the restarted driver undoes what the
    record lists (every plugin DELed, in reverse, whatever got that far) and attaches the pod
    again, whole, once; the claim's status is the two interfaces, nothing left over."""
    node = Node.start(tmp_path, FakePlugins(crash_at=("ADD", n)))
    two_networks(node)
    with pytest.raises(Crash):
        await node.hooks.run_pod_sandbox(pod("a"))
    assert node.store.get("a-sandbox").state is State.ADDING  # type: ignore[union-attr]
    again = Node.start(tmp_path)
    await again.hooks.synchronize([pod("a")])
    assert [(c.if_name, c.plugin) for c in again.plugins.commands("DEL")] == [
        ("net2", "tuning"), ("net2", "bridge"), ("net1", "macvlan")
    ]  # fmt: skip
    assert len(again.plugins.commands("ADD")) == 3
    record = again.store.get("a-sandbox")
    assert record is not None and record.state is State.ADDED and len(record.attachments) == 2
    again.lifecycle.restore_status()
    [claim] = again.status.entries
    assert len(again.status.entries[claim]) == 2


@pytest.mark.parametrize("n", [1, 2, 3])  # every plugin call of the pod's DEL
async def test_a_crash_at_every_del_is_finished_after_the_restart(tmp_path: Path, n: int) -> None:
    """Wherever the process dies among the pod's DELs, the record says DELETING and the
    restarted driver DELs every plugin of it again (DEL is idempotent) and forgets it."""
    node = Node.start(tmp_path, FakePlugins(crash_at=("DEL", n)))
    two_networks(node)
    await node.hooks.run_pod_sandbox(pod("a"))
    with pytest.raises(Crash):
        await node.hooks.stop_pod_sandbox(pod("a"))
    assert node.store.get("a-sandbox").state is State.DELETING  # type: ignore[union-attr]
    again = Node.start(tmp_path)
    await again.hooks.synchronize([])
    assert len(again.store) == 0 and not again.lifecycle.detaches
    assert [c.if_name for c in again.plugins.commands("DEL")] == ["net2", "net2", "net1"]


@pytest.mark.parametrize("hold_from_attach", [False, True])
async def test_a_failing_del_is_retried_with_backoff_and_holds_the_finalizer(
    tmp_path: Path, hold_from_attach: bool
) -> None:
    """By default the claim is held only once a DEL fails (no request while all goes well:
    Kubernetes keeps the claim while its pod lives); --claim-finalizer=on-attach holds it from
    the first interface on."""
    node = Node.start(
        tmp_path, FakePlugins(failing={"macvlan": "DEL"}), hold_from_attach=hold_from_attach
    )
    two_networks(node)
    await node.hooks.run_pod_sandbox(pod("a"))
    assert list(node.status.finalizers.values()) == ([True] if hold_from_attach else [])
    await node.hooks.stop_pod_sandbox(pod("a"))
    [claim] = node.status.finalizers
    assert node.status.finalizers[claim] is True
    assert node.status.events[-1][1] == "NetworkDetachFailed"
    assert node.lifecycle.retrying("a-sandbox")
    node.plugins.failing.clear()  # the fault clears
    await node.settle()
    assert len(node.store) == 0 and node.status.finalizers[claim] is False
    assert not node.lifecycle.detaches and not node.lifecycle.held


async def test_a_claim_held_by_an_earlier_process_is_released_after_a_restart(
    tmp_path: Path,
) -> None:
    """The process that held the claim (a failed DEL, or an earlier version holding from
    attach) is gone: the new one does not know, so it releases every claim of the records it
    found on disk once their interfaces are gone."""
    node = Node.start(tmp_path, hold_from_attach=True)
    two_networks(node)
    await node.hooks.run_pod_sandbox(pod("a"))
    again = Node.start(tmp_path)  # holds only on failure, and has asked for nothing yet
    await again.hooks.stop_pod_sandbox(pod("a"))
    assert list(again.status.finalizers.values()) == [False]
    third = Node.start(tmp_path)  # nothing on disk: nothing to release
    two_networks(third, "b-uid", "d")
    await third.hooks.run_pod_sandbox(pod("b"))
    await third.hooks.stop_pod_sandbox(pod("b"))
    assert third.status.finalizers == {}


async def test_a_removed_sandbox_whose_namespace_is_gone_stops_retrying(tmp_path: Path) -> None:
    node = Node.start(tmp_path, FakePlugins(failing={"macvlan": "DEL"}))
    two_networks(node)
    await node.hooks.run_pod_sandbox(pod("a"))
    node.gone.add("/run/netns/a-sandbox")
    await node.hooks.remove_pod_sandbox(pod("a"))
    assert len(node.store) == 0 and not node.lifecycle.detaches and not node.lifecycle.removed


async def test_a_shared_claim_keeps_its_finalizer_until_its_last_sandbox_is_gone(
    tmp_path: Path,
) -> None:
    node = Node.start(tmp_path, hold_from_attach=True)
    prepare(node.checkpoint, "shared", ("a-uid", "b-uid"), ("net1", network("s", "macvlan")))
    await node.hooks.run_pod_sandbox(pod("a"))
    await node.hooks.run_pod_sandbox(pod("b"))
    [claim] = node.status.finalizers
    await node.hooks.stop_pod_sandbox(pod("a"))
    assert node.status.finalizers[claim] is True
    await node.hooks.stop_pod_sandbox(pod("b"))
    assert node.status.finalizers[claim] is False


async def test_a_shared_claim_held_after_a_failed_del_stays_held_while_another_uses_it(
    tmp_path: Path,
) -> None:
    node = Node.start(tmp_path, FakePlugins(failing={"macvlan": "DEL"}))
    prepare(node.checkpoint, "shared", ("a-uid", "b-uid"), ("net1", network("s", "macvlan")))
    await node.hooks.run_pod_sandbox(pod("a"))
    await node.hooks.run_pod_sandbox(pod("b"))
    assert node.status.finalizers == {}
    await node.hooks.stop_pod_sandbox(pod("a"))
    [claim] = node.status.finalizers
    assert node.status.finalizers[claim] is True
    node.plugins.failing.clear()
    await node.settle()  # a's DEL succeeds on a retry; b still has the claim's interface
    assert node.status.finalizers[claim] is True
    await node.hooks.stop_pod_sandbox(pod("b"))
    assert node.status.finalizers[claim] is False


async def test_the_sweeper_undoes_sandboxes_that_vanished_without_a_hook(tmp_path: Path) -> None:
    node = Node.start(tmp_path)
    two_networks(node)
    two_networks(node, "b-uid", "d")
    await node.hooks.run_pod_sandbox(pod("a"))
    await node.hooks.run_pod_sandbox(pod("b"))
    node.gone.add("/run/netns/a-sandbox")
    assert await node.reconciler.sweep() == 1
    assert [r.sandbox_id for r in node.store.all()] == ["b-sandbox"]


async def test_a_claim_is_unprepared_only_after_its_interfaces_are_gone(tmp_path: Path) -> None:
    node = Node.start(tmp_path, FakePlugins(failing={"macvlan": "DEL"}))
    claim = prepare(node.checkpoint, "c", "a-uid", ("net1", network("one", "macvlan")))
    await node.hooks.run_pod_sandbox(pod("a"))
    with pytest.raises(RuntimeError, match="still being removed"):
        await node.reconciler.unprepare_claim(claim.ref)
    node.plugins.failing.clear()
    await node.reconciler.unprepare_claim(claim.ref)
    assert len(node.store) == 0
    await node.settle()


async def test_state_stays_bounded_after_10000_pods(tmp_path: Path) -> None:
    node = Node.start(tmp_path)
    prepare(node.checkpoint, "c", "p0-uid", ("net1", network("one", "macvlan")))
    await node.hooks.run_pod_sandbox(pod("p0"))
    for i in range(1, 10_001):  # pods of other owners: no claim of cnidra's
        other = pod(f"p{i}")
        await node.hooks.run_pod_sandbox(other)
        await node.hooks.stop_pod_sandbox(other)
        await node.hooks.remove_pod_sandbox(other)
    await node.hooks.stop_pod_sandbox(pod("p0"))
    await node.hooks.remove_pod_sandbox(pod("p0"))
    life = node.lifecycle
    assert (len(life.locks), len(life.detaches), len(life.removed), len(node.store)) == (0, 0, 0, 0)
    assert len(node.plugins.calls) == 2  # one ADD and one DEL, for the one pod of cnidra's


async def test_one_pods_failure_does_not_stop_the_late_attach_of_the_others(
    tmp_path: Path,
) -> None:
    node = Node.start(tmp_path)
    two_networks(node, "a-uid", "c")
    two_networks(node, "b-uid", "d")
    calls = 0

    def flaky() -> frozenset[str]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("netlink hiccup")
        return frozenset()

    node.lifecycle.protected_links = flaky
    await node.hooks.synchronize([pod("a"), pod("b")])  # both started while cnidra was away
    assert [r.sandbox_id for r in node.store.all()] == ["b-sandbox"]
    assert len(node.plugins.commands("ADD")) == 3


async def test_a_sandbox_recovered_without_its_spec_is_attached_through_its_pause_pid(
    tmp_path: Path,
) -> None:
    node = Node.start(tmp_path)
    two_networks(node)
    await node.hooks.create_container(pod("a", pid=4242))  # its RunPodSandbox was never sent
    record = node.store.get("a-sandbox")
    assert record is not None and record.state is State.ADDED
    assert record.netns == "/proc/4242/ns/net"
    assert {c.if_name for c in node.plugins.commands("ADD")} == {"net1", "net2"}


async def test_a_host_network_pod_is_refused_never_attached_to_the_node(tmp_path: Path) -> None:
    from cnidra.nri.lifecycle import AttachError

    node = Node.start(tmp_path)
    two_networks(node)
    with pytest.raises(AttachError, match="hostNetwork"):
        await node.hooks.run_pod_sandbox(pod("a", pid=NODE_PAUSE_PID))
    assert node.plugins.calls == [] and len(node.store) == 0
    assert node.status.events[-1][1] == "NetworkAttachFailed"


async def test_a_stale_rollback_retry_never_undoes_a_later_attach(tmp_path: Path) -> None:
    """A rollback that must retry (its DEL failed) stops once the sandbox is attached again (a
    late attach after the reconnect): it undoes only its own record. (A stopped sandbox is
    never attached again: CRI has no restart for it.)"""
    node = Node.start(tmp_path, FakePlugins(failing={"macvlan": "DEL"}))
    two_networks(node)
    await node.hooks.run_pod_sandbox(pod("a"))
    record = node.store.get("a-sandbox")
    assert record is not None
    await node.store.put(record.with_state(State.ADDING))  # as a crash mid-ADD leaves it
    await node.hooks.synchronize([pod("a")])  # undone: its DEL fails, a retry is in flight
    assert node.lifecycle.retrying("a-sandbox")
    node.plugins.failing.clear()
    await node.store.remove("a-sandbox")  # undone by someone else, then attached again
    await node.hooks.synchronize([pod("a")])
    await node.settle()
    record = node.store.get("a-sandbox")
    assert record is not None and record.state is State.ADDED


async def test_a_del_never_enters_the_nodes_namespace(tmp_path: Path) -> None:
    """A sandbox reached through its pause pid whose pid now belongs to a host process: DEL
    runs without a namespace (the plugins release what they hold), never in the node's."""
    node = Node.start(tmp_path)
    two_networks(node)
    await node.hooks.create_container(pod("a", pid=4242))
    node.lifecycle.node_netns = lambda path: path == "/proc/4242/ns/net"  # the pid was reused
    await node.hooks.stop_pod_sandbox(pod("a", pid=4242))
    dels = node.plugins.commands("DEL")
    assert len(dels) == 3 and {c.netns for c in dels} == {""}
    assert len(node.store) == 0


async def test_normal_events_say_what_was_added_and_removed(tmp_path: Path) -> None:
    """As Multus' AddedInterface: what `kubectl describe pod` shows first; the removal is a
    detail (written with `--normal-events=all`)."""
    node = Node.start(tmp_path)
    prepare(node.checkpoint, "c", "a-uid", ("net1", network("data", "macvlan")))
    await node.hooks.run_pod_sandbox(pod("a"))
    await node.hooks.stop_pod_sandbox(pod("a"))
    await node.settle()
    normal = [e for e, t in zip(node.status.events, node.status.event_types, strict=True)
              if t == "Normal"]  # fmt: skip
    assert [reason for _, reason, _ in normal] == ["AddedInterface", "RemovedInterface"]
    added, removed = (message for _, _, message in normal)
    assert added.startswith("Add net1 [198.18.0.2/24] from data") and "claim c" in added
    assert removed == "Removed net1 (data)"
    details = [d for d, t in zip(node.status.event_details, node.status.event_types, strict=True)
               if t == "Normal"]  # fmt: skip
    assert details == [False, True]


async def test_attach_and_detach_are_timed_and_failures_counted_by_network_and_reason(
    tmp_path: Path,
) -> None:
    from cnidra.observe import metrics

    def sample(name: str, **labels: str) -> float:
        return metrics.REGISTRY.get_sample_value(name, labels) or 0.0

    count = "cnidra_attach_duration_seconds_count"
    node = Node.start(tmp_path)
    prepare(node.checkpoint, "c", "a-uid", ("net1", network("fast", "macvlan")))
    before = (
        sample(count, network="fast"),
        sample(count.replace("attach", "detach"), network="fast"),
    )
    await node.hooks.run_pod_sandbox(pod("a"))
    await node.hooks.stop_pod_sandbox(pod("a"))
    after = sample(count, network="fast"), sample(count.replace("attach", "detach"), network="fast")
    assert after == (before[0] + 1, before[1] + 1)
    assert node.lifecycle.interfaces() == []  # stopped: no series left

    broken = Node.start(tmp_path / "b", FakePlugins(failing={"bridge": "ADD"}))
    prepare(broken.checkpoint, "c", "b-uid", ("net1", network("flaky", "bridge")))
    failures = "cnidra_attach_failures_total"
    was = sample(failures, network="flaky", reason="try-again-later")
    with pytest.raises(Exception, match="it broke"):
        await broken.hooks.run_pod_sandbox(pod("b"))
    assert sample(failures, network="flaky", reason="try-again-later") == was + 1


async def test_attached_interfaces_are_listed_for_the_telemetry(tmp_path: Path) -> None:
    node = Node.start(tmp_path)
    two_networks(node)
    await node.hooks.run_pod_sandbox(pod("a"))
    listed = node.lifecycle.interfaces()
    assert [(i.claim, i.request, i.interface) for i in listed] == [
        ("c", "req0", "net1"),
        ("c", "req1", "net2"),
    ]
    assert {i.netns for i in listed} == {node.store.get("a-sandbox").netns}  # type: ignore[union-attr]


async def test_a_pod_is_said_gone_once_its_last_sandbox_is(tmp_path: Path) -> None:
    """The status writer remembers which interfaces it wrote into each pod's annotation; told
    nothing when a pod went, it kept that for every pod of the node's life (issue 27's soak)."""
    node = Node.start(tmp_path)
    prepare(node.checkpoint, "c", "a-uid", ("net1", network("one", "macvlan")))
    await node.hooks.run_pod_sandbox(pod("a"))
    await node.hooks.run_pod_sandbox(pod("a", sandbox="a-again"))  # re-created meanwhile
    await node.hooks.stop_pod_sandbox(pod("a"))
    assert node.status.gone == []  # its new sandbox still has the interfaces
    await node.hooks.stop_pod_sandbox(pod("a", sandbox="a-again"))
    assert [p.name for p in node.status.gone] == ["a"]


async def test_unpreparing_one_claim_dels_only_its_attachments(tmp_path: Path) -> None:
    """A sandbox with two claims: unpreparing one DELs its interface alone; the other claim's
    stays, attached and recorded (it DELed every interface of the sandbox)."""
    node = Node.start(tmp_path)
    one = prepare(node.checkpoint, "c1", "a-uid", ("net1", network("one", "macvlan")))
    prepare(node.checkpoint, "c2", "a-uid", ("net2", network("two", "bridge", "tuning")))
    await node.hooks.run_pod_sandbox(pod("a"))
    assert len(node.plugins.commands("ADD")) == 3

    await node.reconciler.unprepare_claim(one.ref)

    assert [(c.if_name, c.plugin) for c in node.plugins.commands("DEL")] == [("net1", "macvlan")]
    record = node.store.get("a-sandbox")
    assert record is not None and record.state is State.ADDED
    assert [a.attachment.if_name for a in record.attachments] == ["net2"]
    assert not any(a.pending for a in record.attachments)
    assert [c.name for c in record.claims()] == ["c2"]
    assert not node.status.entries.get(one.ref)  # its status entry goes with it
    assert [s.interface for s in node.status.networks[record.pod]] == ["net2"]
    assert (one.ref, False) in node.status.released_claims

    again = Node.start(tmp_path)  # the record on disk says the same
    await again.hooks.synchronize([pod("a")])
    assert again.plugins.commands("DEL") == [] and again.plugins.commands("ADD") == []
    await node.hooks.stop_pod_sandbox(pod("a"))  # the rest goes with the sandbox
    assert [c.if_name for c in node.plugins.commands("DEL")][1:] == ["net2", "net2"]


async def test_unpreparing_a_sandboxes_only_claim_undoes_the_sandbox(tmp_path: Path) -> None:
    node = Node.start(tmp_path)
    claim = prepare(node.checkpoint, "c", "a-uid", ("net1", network("one", "macvlan")))
    await node.hooks.run_pod_sandbox(pod("a"))
    await node.reconciler.unprepare_claim(claim.ref)
    assert len(node.store) == 0 and len(node.plugins.commands("DEL")) == 1


async def test_a_failed_del_of_one_claim_holds_it_and_kubelets_retry_finishes(
    tmp_path: Path,
) -> None:
    node = Node.start(tmp_path, FakePlugins(failing={"macvlan": "DEL"}))
    one = prepare(node.checkpoint, "c1", "a-uid", ("net1", network("one", "macvlan")))
    prepare(node.checkpoint, "c2", "a-uid", ("net2", network("two", "bridge")))
    await node.hooks.run_pod_sandbox(pod("a"))
    with pytest.raises(RuntimeError, match="still being removed"):
        await node.reconciler.unprepare_claim(one.ref)
    assert node.status.finalizers.get(one.ref) is True  # held while its interface remains
    record = node.store.get("a-sandbox")
    assert record is not None and [a.pending for a in record.attachments] == [True, False]

    node.plugins.failing.clear()
    await node.reconciler.unprepare_claim(one.ref)  # kubelet's retry
    record = node.store.get("a-sandbox")
    assert record is not None and [a.attachment.if_name for a in record.attachments] == ["net2"]
    assert node.status.finalizers.get(one.ref) is False
    assert [c.if_name for c in node.plugins.commands("DEL")] == ["net1", "net1"]
