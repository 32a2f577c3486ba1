"""A state root that fills up (issue 27): the sweeper says so once and keeps going instead of
dying with a traceback, health and prepare learn why, nothing on disk is half-written, and all
of it recovers by itself once there is room."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.nri.fakes import Node, network, pod, prepare


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "state"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(root)], check=True)
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


async def until(condition: Callable[[], bool], within: float = 30.0) -> None:
    for _ in range(int(within / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not within {within} s")


def fill(root: Path) -> Path:
    filler = root / "filler"
    with contextlib.suppress(OSError), open(filler, "wb") as f:
        while True:
            f.write(b"\0" * 65536)
            f.flush()
    return filler


@pytest.mark.netns  # mounts a tmpfs: root
async def test_a_full_state_root_is_named_survived_and_recovered_from(
    small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = Node.start(small_disk)
    prepare(node.checkpoint, "c", "a-uid", ("net1", network("data", "macvlan")))
    await node.hooks.run_pod_sandbox(pod("a"))
    before = (small_disk / "sandboxes" / "a-sandbox.json").read_bytes()
    filler = fill(small_disk)
    node.gone.add(node.store.get("a-sandbox").netns)  # type: ignore[union-attr]
    caplog.set_level(logging.INFO)
    probes = 0
    probe = node.reconciler.write_problem

    def counted() -> str | None:
        nonlocal probes
        probes += 1
        return probe()

    node.reconciler.write_problem = counted  # type: ignore[method-assign]
    sweeper = asyncio.create_task(node.reconciler.run_sweeper(0.05))
    await until(lambda: probes >= 10 or sweeper.done())  # ten sweeps met the full disk
    assert not sweeper.done()  # alive, not restarting with a traceback
    problem = node.reconciler.state_problem
    assert problem is not None and "No space left on device" in problem
    assert sum("cannot be written" in r.message for r in caplog.records) == 1  # said once
    assert not any(r.exc_info for r in caplog.records)
    # nothing already on disk was touched, nothing half-written
    assert (small_disk / "sandboxes" / "a-sandbox.json").read_bytes() == before
    assert not list((small_disk / "sandboxes").glob(".*"))
    filler.unlink()
    await until(lambda: node.store.get("a-sandbox") is None or sweeper.done())
    sweeper.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sweeper
    assert node.reconciler.state_problem is None
    assert node.store.get("a-sandbox") is None  # the sweep ran and undid the gone sandbox
    for path in small_disk.rglob("*.json"):
        json.loads(path.read_bytes())  # every record whole
