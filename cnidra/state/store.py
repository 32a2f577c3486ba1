"""A directory of JSON records, one atomic file each, mirrored in memory: the shape of both the
prepared-claims checkpoint and the sandbox records.

Writes are on disk before they are visible. A durable store (the checkpoint, the IPAM state)
makes every change durable with one fsync, whatever the number of records it changes (a
prepare of 100 claims is one fsync, not 101): the change is appended to the store's log
(`claims.log` beside `claims/`, one frame with its length and CRC) and the log fsynced, and
that is all it writes: the log is the durable record, the memory the one read while running.
The records' files are written only when the store settles: on opening (the files read, the
log's whole frames replayed over them, a torn last frame, never acknowledged, ignored), when
the log has grown past LOG_MAX (after the change that grew it is acknowledged), and on a
clean `close()`; settling writes the files the log names durably, then empties the log. A
settle while running never holds up a change: the long log is renamed aside (`claims.settling`)
and a new one begun under the store's lock, and the files of what the old one holds are
written in a worker thread while changes go on into the new log; the old log is removed once
its files are durable (opening replays it first, then the log). So the files alone may be
behind: whatever reads a durable store from outside reads it with
`read_records`, the files with the log replayed over them. All of it in a worker thread, so
the event loop keeps serving other hooks. A store that needs only to survive the process (the
sandbox records: a machine crash ends every sandbox they describe) writes its files in place,
atomically, without fsync and without a log. `put_blocking` is for code that runs before the
loop does (start-up, migration, tools)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import struct
import threading
import weakref
import zlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

from cnidra.util.files import fsync_dir, write_all_atomically, write_atomically

log = logging.getLogger(__name__)
T = TypeVar("T")
LOG_SUFFIX = ".log"  # the log of <dir> is <dir>.log, beside it
SETTLING_SUFFIX = ".settling"  # a log renamed aside while its files are written (<dir>.settling)
LOG_MAX = 4 * 1024 * 1024  # bytes of log after which the files are made durable and it emptied
_HEADER = struct.Struct(">II")  # a frame: payload length, CRC-32 of the payload


class JsonDirStore(Generic[T]):
    def __init__(
        self,
        directory: Path,
        decode: Callable[[Mapping[str, Any]], T],
        encode: Callable[[T], Mapping[str, Any]],
        key: Callable[[T], str],
        *,
        durable: bool = True,
        dumps: Callable[[Mapping[str, Any]], str] | None = None,
    ) -> None:
        self.dir = directory
        self.durable = durable
        self._encode = encode
        self._dumps = dumps or compact_json
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
        self._lock = threading.Lock()  # one change at a time: the log's frames in order
        self._settle_lock = threading.Lock()  # one settle writing files at a time
        self._unsettled: set[str] = set()  # keys whose files are not yet durable
        self._log_fd = -1
        self._settler: asyncio.Future[None] | None = None  # a settle while running
        # group commit: the changes waiting for the next write, and the task writing them
        self._waiting: list[_Change[T]] = []
        self._writer: asyncio.Future[None] | None = None
        if durable:
            self._open_log(decode)

    # ------------------------------------------------------------------ the log

    @property
    def log_path(self) -> Path:
        """Beside the directory (`claims.log` by `claims/`), so the directory holds only
        records."""
        return self.dir.with_name(f"{self.dir.name}{LOG_SUFFIX}")

    @property
    def settling_path(self) -> Path:
        """A log renamed aside while a settle writes the files of what it holds."""
        return self.dir.with_name(f"{self.dir.name}{SETTLING_SUFFIX}")

    def _open_log(self, decode: Callable[[Mapping[str, Any]], T]) -> None:
        """Replay what the logs hold over the files (a log left aside by a settle that did not
        finish, then the log), make it durable in them, empty the log."""
        created = not self.log_path.exists()
        replayed: set[str] = set()
        logged = _read_or_empty(self.settling_path)
        frames = _frames(logged) + ([] if created else _frames(self.log_path.read_bytes()))
        for change in frames:
            for key, data in (change.get("put") or {}).items():
                try:
                    self._items[key] = decode(data)
                except (ValueError, KeyError, TypeError, AttributeError) as exc:
                    log.error("a logged change of record %s is unreadable: %s", key, exc)
                    continue
                replayed.add(key)
            for key in change.get("remove") or []:
                self._items.pop(key, None)
                replayed.add(key)
        self._log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._closer = weakref.finalize(self, os.close, self._log_fd)
        self._unsettled = replayed
        if replayed or logged or os.fstat(self._log_fd).st_size:
            self._settle()
        elif created:
            fsync_dir(self.log_path.parent)  # the log's own name, once

    def _append(self, change: Mapping[str, Any] | bytes, *, sync: bool = True) -> None:
        """One frame; durable (one fsync) when `sync`. A failed append is cut off again, so
        no torn frame sits before later ones."""
        size = os.fstat(self._log_fd).st_size
        try:
            _write_frame(self._log_fd, change)
            if sync:
                os.fsync(self._log_fd)
        except BaseException:
            os.ftruncate(self._log_fd, size)
            raise

    def _settle(self) -> None:
        """The files of the changes the log holds written and made durable (each file and the
        directory fsynced), then the log emptied: what opening, a long log while running and
        a clean close do. A crash anywhere in it leaves the log whole, replayed again on
        opening (a frame holds its records whole, so replaying it twice is replaying it once).
        A log left aside goes once the files are durable, before the log is emptied (replayed
        after the log was, it would undo the log's later changes to the files)."""
        self._write_files(self._snapshot(self._unsettled))
        self.settling_path.unlink(missing_ok=True)
        os.ftruncate(self._log_fd, 0)
        os.fsync(self._log_fd)
        self._unsettled = set()

    def _snapshot(self, keys: Iterable[str]) -> list[tuple[str, bytes | None]]:
        """The records of `keys` as their files should hold them now (None: no file)."""
        out: list[tuple[str, bytes | None]] = []
        for key in sorted(keys):
            item = self._items.get(key)
            out.append((key, None if item is None else self._serialize(item)[1]))
        return out

    def _write_files(self, snapshot: list[tuple[str, bytes | None]]) -> None:
        """The files of a snapshot, durable (each file and the directory fsynced)."""
        files = []
        for key, data in snapshot:
            if data is None:
                (self.dir / f"{key}.json").unlink(missing_ok=True)
            else:
                files.append((self.dir / f"{key}.json", data))
        if files:
            write_all_atomically(files)
        else:
            fsync_dir(self.dir)  # the removals

    def _set_aside(self) -> list[tuple[str, bytes | None]] | None:
        """Under the lock, a long log renamed aside and a new one begun (its name durable before
        any change is acknowledged in it); the snapshot of the records the old one changed,
        whose files `_settle_aside` writes without the lock. None: the log is not long, or a
        log is still aside (its settle failed: the next settle is a whole one)."""
        with self._lock:
            if not self._log_is_long() or self.settling_path.exists():
                return None
            os.replace(self.log_path, self.settling_path)
            fd = -1
            try:
                fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                fsync_dir(self.log_path.parent)
            except Exception:  # the log as it was: its name back, appended to as before
                if fd >= 0:
                    os.close(fd)
                os.replace(self.settling_path, self.log_path)
                raise
            self._closer()
            self._log_fd = fd
            self._closer = weakref.finalize(self, os.close, fd)
            snapshot = self._snapshot(self._unsettled)
            self._unsettled = set()
            return snapshot

    def _settle_aside(self, snapshot: list[tuple[str, bytes | None]]) -> None:
        """The files of a log set aside written durably, then that log removed. A failure is
        said; its records wait for the next settle, a whole one (the log aside kept, so
        opening replays it)."""
        try:
            self._write_files(snapshot)
            self.settling_path.unlink()
        except Exception as exc:
            log.error("settling %s into its files failed, the log kept: %s", self.dir, exc)
            with self._lock:
                self._unsettled.update(key for key, _ in snapshot)

    def _change(self, put: list[tuple[str, bytes, T]], remove: list[str]) -> None:
        """A durable store's change: logged with one fsync (removals without: as an unlink,
        they need not survive a power loss) and made visible; no file written."""
        with self._lock:
            self._append(_logged(put, remove), sync=bool(put))
            self._mirror(put, remove)
        self._settle_if_long()

    def _changes(self, changes: list[_Change[T]]) -> None:
        """Several callers' changes in one go (group commit): each its own frame, in the
        order they were asked for, then one fsync for all of them, then each change made
        visible. A frame that cannot be written (or the fsync) fails every change of the
        group, its frames cut off again."""
        with self._lock:
            size = os.fstat(self._log_fd).st_size
            try:
                for change in changes:
                    _write_frame(self._log_fd, _logged(change.put, change.remove))
                if any(c.put for c in changes):
                    os.fsync(self._log_fd)
            except BaseException as exc:
                os.ftruncate(self._log_fd, size)
                for change in changes:
                    change.error = exc
                return
            for change in changes:
                self._mirror(change.put, change.remove)

    def _mirror(self, put: list[tuple[str, bytes, T]], remove: list[str]) -> None:
        """A logged change made visible in memory, its keys left for the next settle."""
        for key, _, item in put:
            self._items[key] = item
            self._unsettled.add(key)
        for key in remove:
            self._items.pop(key, None)
            self._unsettled.add(key)

    def _log_is_long(self) -> bool:
        return self._log_fd >= 0 and os.fstat(self._log_fd).st_size > LOG_MAX

    def _settle_if_long(self) -> None:
        """Settle a log grown past LOG_MAX (in the caller's thread: start-up, tools). The
        changes in it are durable already: a settle that fails is said and tried again after
        the next change, the log kept meanwhile."""
        snapshot = self._aside_or_whole()
        if snapshot is not None:
            with self._settle_lock:
                self._settle_aside(snapshot)

    def _aside_or_whole(self) -> list[tuple[str, bytes | None]] | None:
        """A long log set aside (its snapshot returned), or, when one still is from a settle
        that failed, a whole settle under the lock (None returned)."""
        with self._settle_lock:
            try:
                snapshot = self._set_aside()
            except Exception as exc:
                log.error("setting %s's log aside failed, the log kept: %s", self.dir, exc)
                return None
            if snapshot is not None or not self.settling_path.exists():
                return snapshot
            with self._lock:
                if not self._log_is_long():
                    return None
                try:
                    self._settle()
                except Exception as exc:
                    log.error("settling %s into its files failed, the log kept: %s", self.dir, exc)
            return None

    async def _settle_in_background(self) -> None:
        """A long log's settle while changes go on (`_settle_while_long`), unless one runs."""
        if self._settler is None or self._settler.done():
            self._settler = asyncio.ensure_future(self._settle_while_long())

    async def _settle_while_long(self) -> None:
        """Set aside, then its files written in a worker thread that holds up no change; again
        while what was logged meanwhile makes the log long."""
        while self._log_is_long():
            snapshot = await asyncio.to_thread(self._aside_or_whole)
            if snapshot is None:
                return
            await asyncio.to_thread(self._settle_aside_locked, snapshot)

    def _settle_aside_locked(self, snapshot: list[tuple[str, bytes | None]]) -> None:
        with self._settle_lock:
            self._settle_aside(snapshot)

    async def _commit(self, put: list[tuple[str, bytes, T]], remove: list[str]) -> None:
        """A durable change, done together with the changes other callers ask for meanwhile:
        while one group is being written in the worker thread, the next one gathers, and
        is written with one thread hop and one fsync when that one is done. Returns when this
        change is durable (or raises what failed it), as `_change` alone would."""
        change = _Change(put, remove, asyncio.get_running_loop().create_future())
        self._waiting.append(change)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.ensure_future(self._write_groups())
        await change.done

    async def _write_groups(self) -> None:
        while self._waiting:
            group, self._waiting = self._waiting, []
            try:
                await asyncio.to_thread(self._changes, group)
            except BaseException as exc:  # the thread could not run it (or the loop stops)
                for change in group:
                    change.error = change.error or exc
                if isinstance(exc, asyncio.CancelledError):
                    self._settle_group(group)
                    raise
            self._settle_group(group)
            if self._log_is_long():  # after the group is acknowledged: not in its latency
                try:
                    await self._settle_in_background()
                except BaseException as exc:  # the loop stops: no change left waiting
                    waiting, self._waiting = self._waiting, []
                    for change in waiting:
                        change.error = exc
                    self._settle_group(waiting)
                    raise

    def _settle_group(self, group: list[_Change[T]]) -> None:
        for change in group:
            if change.done.done():
                continue
            if change.error is None:
                change.done.set_result(None)
            elif isinstance(change.error, asyncio.CancelledError):
                change.done.cancel()
            else:
                change.done.set_exception(change.error)

    async def quiet(self) -> None:
        """Returns once no change is being written and no settle runs (a clean stop's first
        step; tests)."""
        while (self._writer is not None and not self._writer.done()) or (
            self._settler is not None and not self._settler.done()
        ):
            await asyncio.wait([f for f in (self._writer, self._settler) if f is not None])

    def close(self) -> None:
        """A clean stop, after the last change: a durable store settles (its files written
        whole, the log emptied), so its files alone say what it holds."""
        if self._log_fd < 0:
            return
        with self._settle_lock, self._lock:
            try:
                if self._unsettled or os.fstat(self._log_fd).st_size or self.settling_path.exists():
                    self._settle()
            except Exception as exc:
                log.error("settling %s on close failed, the log kept: %s", self.dir, exc)
            self._closer()
            self._log_fd = -1

    def get(self, key: str) -> T | None:
        return self._items.get(key)

    async def put(self, item: T) -> None:
        key, data = self._serialize(item)
        if self.durable:  # visible once written (not again after: a later change stands)
            await self._commit([(key, data, item)], [])
            return
        # page cache only: microseconds, not worth a thread hop
        write_atomically(self.dir / f"{key}.json", data, durable=False)
        self._items[key] = item

    async def put_many(self, items: list[T]) -> None:
        """Several records, durable together with one fsync (one frame of the log)."""
        if not items:
            return
        if not self.durable:
            for item in items:
                await self.put(item)
            return
        serialized = [(*self._serialize(item), item) for item in items]
        await self._commit(serialized, [])  # visible once written, by the writer

    def put_blocking(self, item: T) -> None:
        key, data = self._serialize(item)
        if self.durable:
            self._change([(key, data, item)], [])
            return
        write_atomically(self.dir / f"{key}.json", data, durable=False)
        self._items[key] = item

    async def remove(self, key: str) -> bool:
        if self.durable:
            present = key in self._items
            await self._commit([], [key])
            return present
        else:
            (self.dir / f"{key}.json").unlink(missing_ok=True)
        return self._items.pop(key, None) is not None

    async def remove_many(self, keys: list[str]) -> None:
        """Several records removed as one change (one frame of a durable store's log)."""
        if not keys:
            return
        if not self.durable:
            for key in keys:
                await self.remove(key)
            return
        await self._commit([], list(keys))

    def all(self) -> Iterable[T]:
        return list(self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def _serialize(self, item: T) -> tuple[str, bytes]:
        return self._key(item), self._dumps(self._encode(item)).encode()


class _Change(Generic[T]):
    """One caller's change waiting for a group commit, and how it ended."""

    __slots__ = ("done", "error", "put", "remove")

    def __init__(
        self, put: list[tuple[str, bytes, T]], remove: list[str], done: asyncio.Future[None]
    ) -> None:
        self.put = put
        self.remove = remove
        self.done = done
        self.error: BaseException | None = None


def _logged(put: list[tuple[str, bytes, Any]], remove: list[str]) -> bytes:
    """A change as its frame records it: `{"put": {key: record}, "remove": [key]}`, the
    records' JSON as they were encoded for their files (not decoded and encoded again)."""
    records = b",".join(json.dumps(key).encode() + b":" + data for key, data, _ in put)
    return b'{"put":{' + records + b'},"remove":' + json.dumps(remove).encode() + b"}"


def _write_frame(fd: int, change: Mapping[str, Any] | bytes) -> None:
    payload = change if isinstance(change, bytes) else compact_json(change).encode()
    view = memoryview(_HEADER.pack(len(payload), zlib.crc32(payload)) + payload)
    while view:
        view = view[os.write(fd, view) :]


# json.dumps with `separators` makes a JSONEncoder each call; this one is made once (the same
# text: the other options are json.dumps's defaults)
_COMPACT = json.JSONEncoder(separators=(",", ":"))


def compact_json(data: Mapping[str, Any]) -> str:
    return _COMPACT.encode(data)


def read_records(directory: Path) -> dict[str, Any]:
    """What a durable store of `directory` holds, read from outside it (a CLI, a test, a
    harness): each record's JSON by key, its files with its log's whole frames replayed over
    them, as opening it would, but writing nothing. A store that settles while this reads
    (its log emptied between the files and the log) is read again; each record read is one
    the store held, though not all of them at the same moment if it is changing."""
    log_path = directory.with_name(f"{directory.name}{LOG_SUFFIX}")
    aside_path = directory.with_name(f"{directory.name}{SETTLING_SUFFIX}")
    for _ in range(10):
        aside, before = _read_or_empty(aside_path), _read_or_empty(log_path)
        records: dict[str, Any] = {}
        for path in sorted(directory.glob("*.json")):
            try:
                records[path.stem] = json.loads(path.read_bytes())
            except (OSError, ValueError):
                continue  # removed meanwhile, or unreadable (opening moves it aside)
        after = _read_or_empty(log_path)
        if after.startswith(before) and _read_or_empty(aside_path) == aside:
            break
    for change in _frames(aside) + _frames(after):
        for key, data in (change.get("put") or {}).items():
            records[key] = data
        for key in change.get("remove") or []:
            records.pop(key, None)
    return records


def _read_or_empty(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def _frames(raw: bytes) -> list[dict[str, Any]]:
    """The log's whole frames, in order, up to the first that is torn or not one."""
    out = []
    at = 0
    while at + _HEADER.size <= len(raw):
        length, crc = _HEADER.unpack_from(raw, at)
        payload = raw[at + _HEADER.size : at + _HEADER.size + length]
        if len(payload) < length or zlib.crc32(payload) != crc:
            break
        try:
            change = json.loads(payload)
        except ValueError:
            break
        if not isinstance(change, dict):
            break
        out.append(change)
        at += _HEADER.size + length
    return out
