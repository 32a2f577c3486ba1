"""Supervised background tasks: a death is logged, the task restarts with backoff, and
/healthz is red while a critical one is down."""

from __future__ import annotations

import asyncio

import pytest

from cnidra.observe.tasks import Supervisor
from cnidra.util.backoff import Backoff


async def test_a_task_that_dies_is_restarted_and_health_says_so_meanwhile(
    caplog: pytest.LogCaptureFixture,
) -> None:
    supervisor = Supervisor(lambda: Backoff(0.05, 0.05, jitter=0))
    runs = 0
    alive = asyncio.Event()

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise RuntimeError("watch broke")
        alive.set()
        await asyncio.Event().wait()

    supervisor.spawn("flaky", flaky)
    await asyncio.sleep(0.02)
    assert not supervisor.healthy()  # down, waiting to restart
    assert supervisor.report()["flaky"]["lastError"] == "RuntimeError: watch broke"
    await asyncio.wait_for(alive.wait(), 30)  # restarted after its 0.05 s backoff
    assert supervisor.healthy() and supervisor.report()["flaky"]["restarts"] == 1
    assert "background task flaky died" in caplog.text
    await supervisor.stop()
    assert not supervisor.states["flaky"].running


async def test_a_non_critical_task_does_not_make_the_driver_unhealthy() -> None:
    supervisor = Supervisor(lambda: Backoff(10, 10))

    async def dies() -> None:
        raise ValueError("no")

    supervisor.spawn("optional", dies, critical=False)
    await asyncio.sleep(0.01)
    assert supervisor.healthy()
    await supervisor.stop()


def test_backoff_grows_to_its_cap_and_resets() -> None:
    backoff = Backoff(0.5, 4.0, jitter=0)
    assert [backoff.next() for _ in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    backoff.reset()
    assert backoff.next() == 0.5
