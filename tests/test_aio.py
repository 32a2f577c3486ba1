"""cnidra.util.aio.wait_set: set, timed out, and a cancellation that arrives as the timeout
fires is never swallowed (asyncio.wait_for's on 3.11 can be: a loop waiting in it then never
ends); the plugins' exits read from pidfds."""

from __future__ import annotations

import asyncio
import sys
import threading

import pytest

from cnidra.util.aio import reap_children_by_pidfd, wait_set


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


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12 reaps through pidfds itself")
async def test_children_are_reaped_through_a_pidfd_not_a_thread_each() -> None:
    """cnidra.util.aio.reap_children_by_pidfd (the driver's start): a plugin's exit is read from
    a pidfd by the loop, no thread started to wait for it; undone, asyncio's own again."""
    undo = reap_children_by_pidfd()
    assert undo is not None  # this kernel has pidfds (Linux 5.3)
    try:
        threads = threading.active_count()
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", "exit 3", stdout=asyncio.subprocess.PIPE
        )
        assert threading.active_count() <= threads  # no waitpid thread for it (others may end)
        assert await proc.wait() == 3
    finally:
        undo()
    proc = await asyncio.create_subprocess_exec("/bin/sh", "-c", "exit 4")
    assert await proc.wait() == 4
