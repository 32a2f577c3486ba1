"""Entering a network namespace from one thread (setns(2) through libc): what `cnidra try`, the
tests and the interface telemetry need. Only the calling thread moves; the rest of the process
stays where it was."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
from collections.abc import Iterator

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def entered(path: str | os.PathLike[str]) -> Iterator[None]:
    """Run the calling thread (and the processes it spawns) in the namespace at `path`."""
    with open("/proc/thread-self/ns/net", "rb") as home, open(path, "rb") as target:
        setns(target.fileno())
        try:
            yield
        finally:
            setns(home.fileno())
