"""cnidra.util.workqueue: one entry per key, rate-limited requeue on the one backoff, and what a
key leaves behind when done."""

from __future__ import annotations

from collections.abc import Hashable

from cnidra.util.backoff import Backoff
from cnidra.util.workqueue import Lane, WorkQueue


def queue(now: list[float]) -> WorkQueue[str]:
    return WorkQueue(lambda: Backoff(1.0, 4.0, jitter=0.0), clock=lambda: now[0])


def test_a_key_is_queued_once_and_keeps_the_sooner_due_time() -> None:
    now = [100.0]
    q = queue(now)
    q.add("a", after=10)
    q.add("a", after=20)  # a later change never puts off one due sooner
    assert len(q) == 1 and q.due_times["a"] == 110.0 and q.due() == []
    q.add("a")  # due now
    assert q.due() == ["a"] and q.wait() is not None and q.wait() < 0  # type: ignore[operator]


def test_a_failing_key_is_retried_on_its_own_backoff_and_forgotten_when_done() -> None:
    now = [0.0]
    q = queue(now)
    q.add("a")
    q.add("b")
    assert [q.retry("a"), q.retry("a"), q.retry("a"), q.retry("a")] == [1.0, 2.0, 4.0, 4.0]
    assert q.due() == ["b"]  # a's failures hold up no other key
    q.add("a")  # a new change is due now, whatever a's backoff
    assert q.due() == ["a", "b"] and q.retry("a") == 4.0  # the backoff goes on growing
    q.done("a")
    q.add("a")
    assert q.retry("a") == 1.0  # done: forgotten, backoff included
    q.done("a")
    q.done("b")
    assert len(q) == 0 and not q.backoffs and q.wait() is None


def test_hurry_makes_every_key_due_now() -> None:
    now = [0.0]
    q = queue(now)
    q.add("a", after=30)
    q.retry("b")
    q.hurry()
    assert sorted(q.due()) == ["a", "b"]


def test_a_restarted_loop_paces_from_the_start_after_a_long_run() -> None:
    backoff = Backoff(5.0, 300.0, jitter=0.0)
    assert [backoff.after_run(1), backoff.after_run(1), backoff.after_run(1)] == [5, 10, 20]
    assert backoff.after_run(61) == 5.0


def test_hurry_can_pick_the_keys_and_forget_restarts_a_keys_backoff() -> None:
    now = [0.0]
    q = queue(now)
    q.add("a", after=30)
    q.add("b", after=30)
    q.hurry(lambda key: key == "a")
    assert q.due() == ["a"]
    assert [q.retry("a"), q.retry("a")] == [1.0, 2.0]
    q.forget("a")  # went through in part: the next failure paces from the start
    assert "a" in q and q.retry("a") == 1.0


def test_lanes_share_one_queue_each_with_its_own_keys() -> None:
    now = [0.0]
    shared: WorkQueue[tuple[str, Hashable]] = WorkQueue(
        lambda: Backoff(1.0, 4.0, jitter=0.0), clock=lambda: now[0]
    )
    claims: Lane[str] = Lane(shared, "claim")
    pods: Lane[str] = Lane(shared, "pod")
    claims.add("x")
    pods.add("x", after=5)
    assert claims.due() == ["x"] and pods.due() == [] and len(shared) == 2
    assert "x" in claims and "x" in pods and len(claims) == len(pods) == 1
    assert claims.retry("x") == 1.0 and shared.wait() == 1.0  # one wait for every lane
    pods.hurry()
    assert pods.due() == ["x"] and claims.due() == []  # claims' x waits out its backoff
    claims.done("x")
    assert len(claims) == 0 and len(pods) == 1
