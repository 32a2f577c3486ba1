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


# a run's tag in the names of the namespaces it (and every process it starts) creates, so a
# run can tell its own from those of anyone else on the machine (the tests' leak check)
TAG_VARIABLE = "CNIDRA_NETNS_TAG"


def create(prefix: str = "cnidra") -> Path:
    tag = os.environ.get(TAG_VARIABLE, "")
    tag = "".join(c for c in tag if c.isalnum())[:12]
    name = f"{prefix}-{tag}-{uuid.uuid4().hex[:10]}" if tag else f"{prefix}-{uuid.uuid4().hex[:10]}"
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
