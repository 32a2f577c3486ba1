"""asyncio helpers the standard library lacks on Python 3.11."""

from __future__ import annotations

import asyncio


async def wait_set(event: asyncio.Event, seconds: float | None) -> bool:
    """Until `event` is set (True) or `seconds` pass (False). Not `asyncio.wait_for`: on 3.11 it
    can swallow a cancellation that arrives as its timeout fires (CPython gh-86296), and a loop
    that waits in it then never ends (a test's publisher kept running after its cancel)."""
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        return False
    return True
