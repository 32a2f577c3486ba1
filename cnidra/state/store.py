"""A directory of JSON records, one atomic file each, mirrored in memory: the shape of both the
prepared-claims checkpoint and the sandbox records.

Writes are on disk before they are visible. A durable store (the checkpoint) fsyncs file and
directory, milliseconds, in a worker thread, so the event loop keeps serving other hooks; a
store that needs only to survive the process (the sandbox records: a machine crash ends every
sandbox they describe) writes in place, atomically, without fsync. `put_blocking` is for code
that runs before the loop does (start-up, migration, tools)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

from cnidra.util.files import write_all_atomically, write_atomically

log = logging.getLogger(__name__)
T = TypeVar("T")


class JsonDirStore(Generic[T]):
    def __init__(
        self,
        directory: Path,
        decode: Callable[[Mapping[str, Any]], T],
        encode: Callable[[T], Mapping[str, Any]],
        key: Callable[[T], str],
        *,
        durable: bool = True,
    ) -> None:
        self.dir = directory
        self.durable = durable
        self._encode = encode
        self._key = key
        self._items: dict[str, T] = {}
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for path in sorted(self.dir.glob("*.json")):
            try:
                item = decode(json.loads(path.read_bytes()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                log.error("record %s is unreadable, moved aside: %s", path, exc)
                path.rename(path.with_suffix(".corrupt"))
                continue
            self._items[key(item)] = item

    def get(self, key: str) -> T | None:
        return self._items.get(key)

    async def put(self, item: T) -> None:
        key, data = self._serialize(item)
        if self.durable:
            await asyncio.to_thread(write_atomically, self.dir / f"{key}.json", data)
        else:  # page cache only: microseconds, not worth a thread hop
            write_atomically(self.dir / f"{key}.json", data, durable=False)
        self._items[key] = item

    async def put_many(self, items: list[T]) -> None:
        """Several records, each durable as `put` makes one, the directory fsynced once."""
        if not items:
            return
        if len(items) == 1 or not self.durable:
            for item in items:
                await self.put(item)
            return
        serialized = [self._serialize(item) for item in items]
        files = [(self.dir / f"{key}.json", data) for key, data in serialized]
        await asyncio.to_thread(write_all_atomically, files)
        for (key, _), item in zip(serialized, items, strict=True):
            self._items[key] = item

    def put_blocking(self, item: T) -> None:
        key, data = self._serialize(item)
        write_atomically(self.dir / f"{key}.json", data, durable=self.durable)
        self._items[key] = item

    async def remove(self, key: str) -> bool:
        if self.durable:
            await asyncio.to_thread((self.dir / f"{key}.json").unlink, True)
        else:
            (self.dir / f"{key}.json").unlink(missing_ok=True)
        return self._items.pop(key, None) is not None

    def all(self) -> Iterable[T]:
        return list(self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def _serialize(self, item: T) -> tuple[str, bytes]:
        return self._key(item), json.dumps(self._encode(item), separators=(",", ":")).encode()
