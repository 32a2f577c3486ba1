"""cnidra.util.aio.wait_set: set, timed out, and a cancellation that arrives as the timeout
fires is never swallowed (asyncio.wait_for's on 3.11 can be: a loop waiting in it then never
ends)."""

from __future__ import annotations

import asyncio

import pytest

from cnidra.util.aio import wait_set


async def test_set_or_timed_out() -> None:
    event = asyncio.Event()
    assert await wait_set(event, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await wait_set(event, 5) is True
    assert await wait_set(event, None) is True


async def test_a_cancel_at_the_timeout_always_ends_the_loop() -> None:
    async def loop() -> None:
        event = asyncio.Event()
        while True:
            await wait_set(event, 0.001)

    for delay in [i * 0.0005 for i in range(60)]:
        task = asyncio.create_task(loop())
        await asyncio.sleep(delay)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 30)  # a cancel lost: the loop never ends
