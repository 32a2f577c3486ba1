"""One asyncio lock per key, forgotten when nobody holds or waits for it, so the number of
locks follows the work in flight, not every key ever seen."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class Busy(Exception):
    """A key's lock was not got in the time allowed."""


class KeyedLocks:
    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @asynccontextmanager
    async def hold(self, key: str, wait: float | None = None) -> AsyncIterator[None]:
        """The key's lock; Busy when it is not got within `wait` seconds."""
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            if wait is None:  # unbounded: no Timeout context to enter and leave on each hold
                await lock.acquire()
            else:
                try:
                    async with asyncio.timeout(wait):
                        await lock.acquire()
                except TimeoutError:
                    raise Busy(key) from None
            try:
                yield
            finally:
                lock.release()
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        return len(self._locks)

    def busy(self) -> set[str]:
        """The keys held or waited for now."""
        return set(self._locks)
