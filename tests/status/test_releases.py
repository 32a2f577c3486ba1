"""A finalizer removal survives the driver: queued on disk until the apiserver took it, queued
again after a restart (a rolling upgrade, a crash), dropped when the claim is in use again."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from cnidra.api.refs import ObjectRef
from cnidra.status.writer import StatusWriter
from cnidra.util.backoff import Backoff

CLAIM = ObjectRef("ns", "c", "uid-c")


class Apiserver:
    """Takes patches (or, while `down`, refuses them) and remembers the finalizers set."""

    def __init__(self, down: bool = False) -> None:
        self.down = down
        self.finalizers: dict[str, list[str]] = {}

    async def patch(self, resource: Any, name: str, body: dict[str, Any], **_: Any) -> None:
        if self.down:
            raise ConnectionError("apiserver down")
        meta = body.get("metadata", {})
        if "finalizers" in meta:
            self.finalizers[name] = meta["finalizers"]

    async def create(self, *_: Any, **__: Any) -> None:
        return None


async def drain(writer: StatusWriter) -> None:
    worker = asyncio.create_task(writer.run())
    try:
        async with asyncio.timeout(30):  # a hang's bound
            await writer.flushed()
    finally:
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker


async def test_a_release_the_last_process_could_not_write_is_written_after_a_restart(
    tmp_path: Path,
) -> None:
    down = Apiserver(down=True)
    first = StatusWriter(down, releases=tmp_path)  # type: ignore[arg-type]
    first.finalizer(CLAIM, False)
    assert [p.name for p in tmp_path.iterdir()] == ["uid-c.json"]  # then the process dies

    up = Apiserver()
    second = StatusWriter(up, releases=tmp_path)  # type: ignore[arg-type]
    assert second.restore_releases(held=set()) == 1
    await drain(second)
    assert up.finalizers == {"c": []} and not list(tmp_path.iterdir())


async def test_a_claim_in_use_again_keeps_its_finalizer(tmp_path: Path) -> None:
    first = StatusWriter(Apiserver(down=True), releases=tmp_path)  # type: ignore[arg-type]
    first.finalizer(CLAIM, False)
    up = Apiserver()
    second = StatusWriter(up, releases=tmp_path)  # type: ignore[arg-type]
    assert second.restore_releases(held={CLAIM}) == 0
    assert not list(tmp_path.iterdir()) and second.pending() == 0


async def test_holding_again_cancels_a_queued_release(tmp_path: Path) -> None:
    writer = StatusWriter(Apiserver(), releases=tmp_path)  # type: ignore[arg-type]
    writer.finalizer(CLAIM, False)
    writer.finalizer(CLAIM, True)
    assert not list(tmp_path.iterdir())


class FlakyApiserver(Apiserver):
    """Refuses the first `failures` patches, then takes them."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.called = asyncio.Event()

    async def patch(self, resource: Any, name: str, body: dict[str, Any], **kw: Any) -> None:
        self.called.set()
        if self.failures:
            self.failures -= 1
            raise ConnectionError("apiserver busy")
        await super().patch(resource, name, body, **kw)


async def test_a_release_does_not_wait_out_the_backoff_of_an_earlier_failed_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seen in CI: a status write failed during a rolling upgrade, the claim's retry was
    queued seconds ahead, and the finalizer removal after the pod's DEL sat behind it. The
    retries' pace is the test's: two quick ones, then one 60 s ahead (not 0.5 s, 1 s and 2 s
    of the real pace, which a loaded machine blurs into the 0.5 s the removal was given)."""
    paces = iter([0.05, 0.05])
    monkeypatch.setattr(Backoff, "next", lambda self: next(paces, 60.0))
    apiserver = FlakyApiserver(failures=3)
    writer = StatusWriter(apiserver)  # type: ignore[arg-type]
    writer.finalizer(CLAIM, True)
    worker = asyncio.create_task(writer.run())
    try:
        async with asyncio.timeout(30):  # a hang's bound: two retries 50 ms apart
            while apiserver.failures:
                apiserver.called.clear()
                await apiserver.called.wait()
        writer.finalizer(CLAIM, False)
        async with asyncio.timeout(30):  # TimeoutError: the removal waited out the 60 s
            while apiserver.finalizers.get("c") != []:
                apiserver.called.clear()
                await apiserver.called.wait()
        assert apiserver.finalizers["c"] == []
    finally:
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
