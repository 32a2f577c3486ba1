"""Named network namespaces: create, enter, remove. Used by `cnidra try`, the tests and the
benchmarks to run plugins in a throwaway "node" namespace instead of the real host."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

NETNS_RUN_DIR = Path("/run/netns")
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


def create(prefix: str = "cnidra") -> Path:
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    _ip("netns", "add", name)
    _ip("-n", name, "link", "set", "lo", "up")
    return NETNS_RUN_DIR / name


def remove(path: str | os.PathLike[str]) -> None:
    name = Path(path).name
    if (NETNS_RUN_DIR / name).exists():
        _ip("netns", "delete", name)


@contextlib.contextmanager
def temporary(prefix: str = "cnidra") -> Iterator[Path]:
    path = create(prefix)
    try:
        yield path
    finally:
        remove(path)


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
