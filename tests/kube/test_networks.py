"""ServedNetworks at rest: the CNINetworks are LISTed again only when the watch says one
changed, when the watch restarts, or when the listing is older than its max age."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from cnidra.kube.api import Transient
from cnidra.kube.networks import ServedNetworks


def network(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "config": {
                "cniVersion": "1.0.0",
                "name": name,
                "plugins": [{"type": "macvlan", "master": "eth9"}],
            }
        },
    }


class FakeClient:
    """list and watch of the session's AsyncClient, for CNINetworks only."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.lists = 0
        self.watches = 0
        self.events: asyncio.Queue[str | None] = asyncio.Queue()
        # set once a watch has sent every object (the watcher has taken them) and waits
        self.open = asyncio.Event()

    async def list(self, _kind: Any, **_: Any) -> AsyncIterator[dict[str, Any]]:
        self.lists += 1
        for data in list(self.objects.values()):
            yield data

    async def watch(self, _kind: Any, **_: Any) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        self.watches += 1
        for data in list(self.objects.values()):  # as the apiserver opens a watch without RV
            yield "ADDED", data
        self.open.set()
        while (name := await self.events.get()) is not None:
            yield "MODIFIED", self.objects[name]
        raise ConnectionError("watch ended")


async def until(check: Callable[[], bool]) -> None:
    for _ in range(3000):  # 30 s: a bound for a hang, not for a slow machine
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not within 30 s")


async def test_a_resync_at_rest_lists_nothing(tmp_path: Path) -> None:
    client = FakeClient()
    client.objects["a"] = network("a")
    now = [0.0]
    served = ServedNetworks(client, tmp_path, poll=0.01, clock=lambda: now[0])  # type: ignore[arg-type]
    changes: list[int] = []
    watch = asyncio.create_task(served.watch(lambda: changes.append(1)))
    try:
        # the watch opens with every object: stale once (waited for as an event, up to 30 s:
        # a fixed 50 ms on a loaded machine may come before the watch has opened)
        await asyncio.wait_for(client.open.wait(), 30)
        assert [n for n, _ in await served.served()] == ["a"]
        assert client.lists == 1
        for _ in range(5):  # resyncs at rest
            await served.served()
        assert client.lists == 1

        client.objects["b"] = network("b")
        poked = len(changes)
        client.events.put_nowait("b")
        await until(lambda: len(changes) > poked)  # the publisher was poked
        assert [n for n, _ in await served.served()] == ["a", "b"]
        assert client.lists == 2

        now[0] += served.max_age  # a watch that hangs without failing
        await served.served()
        assert client.lists == 3
    finally:
        watch.cancel()


async def test_a_watch_that_ends_makes_the_next_resync_list(tmp_path: Path) -> None:
    client = FakeClient()
    client.objects["a"] = network("a")
    served = ServedNetworks(client, tmp_path, poll=0.01)  # type: ignore[arg-type]
    watch = asyncio.create_task(served._watch_objects(lambda: None))
    try:
        await asyncio.wait_for(client.open.wait(), 30)
        await served.served()
        assert client.lists == 1
        client.events.put_nowait(None)  # the apiserver ends the watch
        await until(lambda: client.events.empty() and served._stale)  # the end was seen
        await served.served()
        assert client.lists == 2  # events may have been missed while no watch was held
    finally:
        watch.cancel()


async def test_a_failed_list_is_asked_again(tmp_path: Path) -> None:
    client = FakeClient()
    served = ServedNetworks(client, tmp_path)  # type: ignore[arg-type]

    async def refused(_kind: Any, **_: Any) -> AsyncIterator[dict[str, Any]]:
        raise ConnectionError("refused")
        yield  # pragma: no cover

    client.list = refused  # type: ignore[method-assign]
    with pytest.raises(Transient, match="refused"):
        await served.served()
    client.list = FakeClient.list.__get__(client)  # type: ignore[method-assign]
    client.objects["a"] = network("a")
    assert [n for n, _ in await served.served()] == ["a"]
