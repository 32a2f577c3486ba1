"""cnidra.util.workers: the loop's worker threads, all started at once and named."""

from __future__ import annotations

import asyncio
import threading

from cnidra.util.workers import PREFIX, start_workers, worker_count


def workers() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(PREFIX)]


async def test_every_worker_is_started_at_once_and_to_thread_uses_them() -> None:
    loop = asyncio.get_running_loop()
    assert workers() == []
    pool = start_workers(loop, 4)
    try:
        assert len(workers()) == 4
        names = await asyncio.gather(
            *(asyncio.to_thread(lambda: threading.current_thread().name) for _ in range(20))
        )
        assert {n.rsplit("_", 1)[0] for n in names} == {PREFIX}
        assert len(workers()) == 4  # none started later
    finally:
        pool.shutdown(wait=True)


def test_as_many_as_asyncios_own_default() -> None:
    assert 5 <= worker_count() <= 32
