"""A directory of JSON records, one atomic, fsynced file each, mirrored in memory: the shape of
both the prepared-claims checkpoint and the sandbox records."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

from cnidra.util.files import write_atomically

log = logging.getLogger(__name__)
T = TypeVar("T")


class JsonDirStore(Generic[T]):
    def __init__(
        self,
        directory: Path,
        decode: Callable[[Mapping[str, Any]], T],
        encode: Callable[[T], Mapping[str, Any]],
        key: Callable[[T], str],
    ) -> None:
        self.dir = directory
        self._encode = encode
        self._key = key
        self._items: dict[str, T] = {}
        self._lock = threading.Lock()
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for path in sorted(self.dir.glob("*.json")):
            try:
                item = decode(json.loads(path.read_bytes()))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.error("record %s is unreadable, moved aside: %s", path, exc)
                path.rename(path.with_suffix(".corrupt"))
                continue
            self._items[key(item)] = item

    def get(self, key: str) -> T | None:
        return self._items.get(key)

    def put(self, item: T) -> None:
        """Written (atomically, fsynced) before it becomes visible in memory."""
        key = self._key(item)
        with self._lock:
            write_atomically(
                self.dir / f"{key}.json",
                json.dumps(self._encode(item), separators=(",", ":")).encode(),
            )
            self._items[key] = item

    def remove(self, key: str) -> bool:
        with self._lock:
            (self.dir / f"{key}.json").unlink(missing_ok=True)
            return self._items.pop(key, None) is not None

    def all(self) -> Iterable[T]:
        return list(self._items.values())

    def __len__(self) -> int:
        return len(self._items)
