"""py-spy flame graphs of a driver process during a measurement (py-spy is not a dependency:
`pip install py-spy`). PYSPY_FORMAT / PYSPY_EXT choose another output (speedscope, raw)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from testbed.harness import DriverProcess


@contextmanager
def profiled(driver: DriverProcess | None, into: Path | None, name: str) -> Iterator[None]:
    """py-spy sampling the driver (all threads, idle included: the hook waits on plugins)."""
    if driver is None or into is None or driver.proc is None:
        yield
        return
    into.mkdir(parents=True, exist_ok=True)
    spy = subprocess.Popen(
        ["py-spy", "record", "--pid", str(driver.proc.pid), "--rate", "250",
         "--format", os.environ.get("PYSPY_FORMAT", "flamegraph"),
         "--output", str(into / f"{name}.{os.environ.get('PYSPY_EXT', 'svg')}")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(1)
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(60)
