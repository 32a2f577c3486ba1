"""Durable file writes shared by the result cache and the checkpoint."""

from __future__ import annotations

import contextlib
import itertools
import os
from pathlib import Path

_NAMES = itertools.count()


def _temporary(path: Path) -> tuple[int, str]:
    """A new file beside `path` (its directories made when missing), open for writing: named
    by this process and a counter, created exclusively (no random name drawn per write, as
    tempfile's, whose generator was a tenth of a checkpoint write's CPU)."""
    while True:
        tmp = f"{path.parent}/.{path.name}.{os.getpid()}.{next(_NAMES)}"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), tmp
        except FileExistsError:  # left by a process of the same pid before: the next name
            continue
        except FileNotFoundError:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)


def write_all_atomically(items: list[tuple[Path, bytes]], mode: int = 0o600) -> None:
    """Several files as `write_atomically(durable=True)` writes one, with each directory
    fsynced once for all of them rather than once per file (a prepare of 100 claims: 100
    directory fsyncs fewer). Each file is durable when this returns."""
    parents: set[Path] = set()
    for path, data in items:
        write_atomically(path, data, mode, durable=False, sync_file=True)
        parents.add(path.parent)
    for parent in parents:
        fsync_dir(parent)


def fsync_dir(directory: Path) -> None:
    """The directory's entries (names created, renamed or removed in it) made durable."""
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_atomically(
    path: Path,
    data: bytes,
    mode: int = 0o600,
    *,
    durable: bool = True,
    sync_file: bool = False,
) -> None:
    """Write to a temp file in the same directory and rename it over `path`: readers see the
    old or the new content, never a mix. `durable` also fsyncs the file and the directory, so
    that holds across a power loss too, not only across a process crash."""
    fd, tmp = _temporary(path)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable or sync_file:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if not durable:
        return
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
