"""The event loop's worker threads (asyncio.to_thread: link reads, state writes with their fsync,
node conf reads): as many as asyncio's default executor allows, but all started at once and
named. asyncio's default starts them one at a time, the first time load needs one more, so a
driver's thread count crept up over its first hours (a soak read 13, then 15, then 17); started
together, it is the same from the first minute to the last, and a stack dump names them
(`cnidra-worker_N`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading

PREFIX = "cnidra-worker"


def worker_count() -> int:
    """asyncio's own bound for its default executor."""
    return min(32, (os.cpu_count() or 1) + 4)


def start_workers(
    loop: asyncio.AbstractEventLoop, count: int | None = None, timeout: float = 5.0
) -> concurrent.futures.ThreadPoolExecutor:
    """The loop's default executor, its `count` threads started now: each of `count` tasks waits
    until all are running, so none can be served by a thread started before it (bounded by
    `timeout`: a machine too slow to start them leaves the rest to start lazily)."""
    count = count or worker_count()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=count, thread_name_prefix=PREFIX)
    barrier = threading.Barrier(count, timeout=timeout)

    def gather() -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait()

    concurrent.futures.wait([pool.submit(gather) for _ in range(count)], timeout=timeout * 2)
    loop.set_default_executor(pool)
    return pool
