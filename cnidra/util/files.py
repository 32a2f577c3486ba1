"""Durable file writes shared by the result cache and the checkpoint."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


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
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable or sync_file:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
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
