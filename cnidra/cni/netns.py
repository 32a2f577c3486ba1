"""Named network namespaces: create, enter, remove. Used by `cnidra try`, the tests and the
benchmarks to run plugins in a throwaway "node" namespace instead of the real host."""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

from cnidra.util.netns import entered, setns

__all__ = ["create", "entered", "remove", "setns", "temporary"]

NETNS_RUN_DIR = Path("/run/netns")


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
