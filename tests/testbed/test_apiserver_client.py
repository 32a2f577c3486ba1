"""The driver's apiserver client (one aiohttp session) against a real kube-apiserver: requests
are answered while the driver holds its long-lived watches (CNINetworks, a node's pods,
policies, pools), each on a connection of its own."""

from __future__ import annotations

import asyncio
import time

import pytest

from cnidra.kube.api import Api, Lease, Namespace, Node, namespaced
from cnidra.kube.client import make_client
from testbed.harness import Cluster
from testbed.layout import Paths

pytestmark = pytest.mark.testbed


def test_requests_are_answered_while_four_watches_are_open(cluster: Cluster) -> None:
    # httpcore's HTTP/2 connection let a stream waiting for a watch event hold its read lock:
    # with three watches on the one connection every later GET ran out of its budget; on
    # aiohttp's HTTP/1.1 pool each watch holds a connection of its own
    config_map = namespaced("", "v1", "ConfigMap", "configmaps")

    async def run() -> list[float]:
        client = make_client(str(Paths.admin_kubeconfig), 5.0)
        api = Api(client, 5.0)
        opened = [asyncio.Event() for _ in range(4)]

        async def watch(number: int, kind: object, **kwargs: str) -> None:
            async for _event, _obj in api.watch(kind, **kwargs):
                opened[number].set()

        watches = [
            asyncio.create_task(watch(0, Namespace)),
            asyncio.create_task(watch(1, Node)),
            asyncio.create_task(watch(2, Lease, namespace="*")),
            asyncio.create_task(watch(3, config_map, namespace="*")),
        ]
        try:
            async with asyncio.timeout(30):
                # each watch's first event: each stream is open
                await asyncio.gather(*(event.wait() for event in opened))
            took = []
            for _ in range(10):
                started = time.monotonic()
                await api.get(Namespace, "default", within=2.0)
                took.append(time.monotonic() - started)
            return took
        finally:
            for task in watches:
                task.cancel()
            await asyncio.gather(*watches, return_exceptions=True)
            await client.close()

    took = asyncio.run(run())
    assert max(took) < 1.0, took
