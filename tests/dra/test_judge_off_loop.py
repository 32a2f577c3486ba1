"""Prepare judges a claim (the pure resolve_claim) in a worker thread within a budget: a costly
claim delays no other claim of the Preparer (nor the event loop), and one past the budget fails
alone, saying so (issue 39)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cnidra.dra.prepare as prepare_module
from cnidra.api.refs import ObjectRef
from cnidra.dra.prepare import JUDGE_BUDGET_S, PrepareError, Preparer
from cnidra.dra.verdicts import NotCached
from cnidra.state.checkpoint import Checkpoint, PreparedClaim
from cnidra.state.layout import StateLayout
from tests.dra.test_prepare import DIRS, VIEW, Claims, named

A = ObjectRef("ns", "a", "u-a")
B = ObjectRef("ns", "b", "u-b")


@pytest.fixture
def costly_a(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Claim a's judgement blocks (as a costly one would) until released; b's is as it is.
    Yields (a's judgement started, release it)."""
    started, release = threading.Event(), threading.Event()
    real = prepare_module.resolve_claim

    def judge(claim: Any, ref: ObjectRef, *args: Any, **kwargs: Any) -> PreparedClaim:
        if ref.name == "a":
            if threading.current_thread() is threading.main_thread():
                raise NotCached("a")  # a costly claim's verdicts are not kept: judged off the loop
            started.set()
            started.set()
            assert release.wait(30)
        return real(claim, ref, *args, **kwargs)

    monkeypatch.setattr(prepare_module, "resolve_claim", judge)
    try:
        yield started, release
    finally:
        release.set()  # whatever the test did, the thread ends


def preparer(tmp_path: Path, **kwargs: Any) -> Preparer:
    checkpoint = Checkpoint(StateLayout(tmp_path))
    claims = Claims(named("a", "u-a", 1), named("b", "u-b", 1))
    return Preparer("n1", claims, checkpoint, DIRS, view=lambda: VIEW, **kwargs)


def test_the_budget_is_a_named_constant() -> None:
    assert JUDGE_BUDGET_S == 2.0


async def test_a_costly_claims_judgement_does_not_delay_another_claim(
    tmp_path: Path, costly_a: tuple[threading.Event, threading.Event]
) -> None:
    started, release = costly_a
    p = preparer(tmp_path, judge_budget=30)
    first = asyncio.create_task(p.prepare(A))
    assert await asyncio.to_thread(started.wait, 10)  # a is being judged, in its thread
    # meanwhile the loop runs and b is prepared: a's judgement holds neither
    prepared = await asyncio.wait_for(p.prepare(B), 10)
    assert prepared.ref == B and not first.done()
    assert p.checkpoint.get("u-b") is not None and p.checkpoint.get("u-a") is None
    release.set()
    assert (await asyncio.wait_for(first, 10)).ref == A


async def test_a_claim_past_the_budget_fails_alone_naming_the_claim_and_the_budget(
    tmp_path: Path, costly_a: tuple[threading.Event, threading.Event]
) -> None:
    _, release = costly_a
    p = preparer(tmp_path, judge_budget=1)  # b's judgement takes far less, even on a busy machine
    answers = await asyncio.wait_for(p.prepare_batch([A, B]), 10)
    a, b = answers
    assert isinstance(a, PrepareError)
    assert str(a) == (
        "claim ns/a: judging its configs took longer than the budget of 1 s a claim may take, "
        "so it is refused; its configs are too large to judge in time: make them smaller"
    )
    assert isinstance(b, PreparedClaim) and b.ref == B
    assert p.checkpoint.get("u-a") is None and p.checkpoint.get("u-b") is not None
    # the thread ends on its own; its slot is free again, and a is judged anew next time
    release.set()
    for _ in range(600):  # 30 s: a hang's bound
        if not p._judge_slots.locked() and p._judge_slots._value == prepare_module.JUDGE_SLOTS:
            break
        await asyncio.sleep(0.05)
    assert p._judge_slots._value == prepare_module.JUDGE_SLOTS
    assert (await asyncio.wait_for(p.prepare(A), 10)).ref == A


async def test_judgements_at_once_are_bounded_and_a_slot_is_held_until_the_thread_ends(
    tmp_path: Path, costly_a: tuple[threading.Event, threading.Event]
) -> None:
    _, release = costly_a
    p = preparer(tmp_path, judge_budget=1)
    with pytest.raises(PrepareError, match=r"budget of 1 s"):
        await p.prepare(A)
    # a's thread still runs past its budget: it keeps its slot
    assert p._judge_slots._value == prepare_module.JUDGE_SLOTS - 1
    assert (await asyncio.wait_for(p.prepare(B), 10)).ref == B
    release.set()
    for _ in range(600):  # 30 s: a hang's bound
        if p._judge_slots._value == prepare_module.JUDGE_SLOTS:
            break
        await asyncio.sleep(0.05)
    assert p._judge_slots._value == prepare_module.JUDGE_SLOTS


def judged_where(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(claim name, "loop" or "thread", and how it ended) of every judgement."""
    seen: list[tuple[str, str]] = []
    real = prepare_module.resolve_claim

    def judge(claim: Any, ref: ObjectRef, *args: Any, **kwargs: Any) -> PreparedClaim:
        where = "loop" if threading.current_thread() is threading.main_thread() else "thread"
        try:
            answer = real(claim, ref, *args, **kwargs)
        except NotCached:
            seen.append((ref.name, f"{where}: not cached"))
            raise
        seen.append((ref.name, where))
        return answer

    monkeypatch.setattr(prepare_module, "resolve_claim", judge)
    return seen


def same_configs() -> Claims:
    """Claims a and b with equal configs, as a template's pods have."""
    a, b = named("x", "u-a", 1), named("x", "u-b", 1)
    a["metadata"]["name"], b["metadata"]["name"] = "a", "b"
    return Claims(a, b)


async def test_a_claim_whose_verdicts_are_kept_is_judged_on_the_loop_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = judged_where(monkeypatch)
    p = Preparer("n1", same_configs(), Checkpoint(StateLayout(tmp_path)), DIRS, view=lambda: VIEW)
    a = await p.prepare(A)
    await p.unprepare(A)  # one pod's: its interface name free again
    b = await p.prepare(B)
    assert seen == [("a", "loop: not cached"), ("a", "thread"), ("b", "loop")]
    assert [d.network for d in a.devices] == [d.network for d in b.devices]
    assert p.verdicts.hits == 1 and p.verdicts.misses == 1


async def test_a_config_the_cache_would_not_keep_is_judged_in_a_thread_every_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = judged_where(monkeypatch)
    p = Preparer("n1", same_configs(), Checkpoint(StateLayout(tmp_path)), DIRS, view=lambda: VIEW)
    p.verdicts.max_key_chars = 10  # every config over the bound: none kept
    await p.prepare(A)
    await p.unprepare(A)
    await p.prepare(B)
    assert [where for _, where in seen] == ["loop: not cached", "thread"] * 2
