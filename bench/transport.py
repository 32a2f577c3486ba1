"""The apiserver client's transport, measured (issue 42: the transport chosen by measurement):
CPU per request, latency, the memory a client library adds, and whether a long-lived watch
stalls requests, for each way the driver could talk to a real TLS kube-apiserver (not a
test: numbers).

    python -m bench.transport [--requests 400] [--rounds 2] [--only a,b] [--json]

Starts its own etcd and kube-apiserver from the test bed's cached build (bench.fleet's
ControlPlane, without the scheduler; not the test bed), makes 10 ResourceClaims with an
allocation, then runs each transport in a fresh subprocess of its own (`--child`), the
transports' order reversed every other round. Each child:

1. reads VmRSS, RssAnon and RssFile (/proc/self/status) with asyncio, ssl and json imported,
   then imports its libraries, makes one client, GETs one claim, and reads them again: the
   memory the library and one connected client add;
2. GETs a claim (as prepare does) and server-side-applies a claim's status (as the status
   writer does: a condition whose message changes, so each is a write), each --requests times
   one at a time and --requests times 10 at a time (each of 10 workers on its own claim), after
   20 not counted: the process's CPU time (`time.process_time()`, every thread) per request,
   and each request's latency, p50 and p99; then 5 fresh clients each sending 10 GETs at once
   (`cold_10`: the connections made with them, TLS handshakes: one on HTTP/2, one a request
   in flight on HTTP/1.1, as after a pool's idle connections expired);
3. opens 3 watches that stay idle (the driver's node-scoped pod watch, of a node with no pods)
   as the driver would hold them on that client, then GETs 30 claims one at a time, each
   allowed 3 s: a GET that does not answer in time is a stall (stops at the third).

The transports:

- `cnidra`: the driver's own (cnidra.kube.client.make_client: cnidra.kube.session's one
  aiohttp session, HTTP/1.1 keep-alive, plain dicts), the requests through cnidra.kube.api.Api
  as prepare (the claim's GET) and the status writer (the status's apply) send them, the
  watches as cnidra.kube.pods.NodePods holds them;
- `lightkube-h2`: the driver's before (its former WatchingClient's shape): lightkube on
  httpx2, requests on one HTTP/2 connection, each watch on an HTTP/1.1 connection of a second
  client; the GET as prepare's was (a generic resource, plain dicts), the apply as the status
  writer's was (ResourceClaimStatus, lightkube's model back);
- `lightkube-h1`: the same on httpx2's HTTP/1.1 keep-alive pool alone, watches included;
- `lightkube-aiohttp`: the same lightkube and Api on httpx2, with aiohttp's connection pool as
  httpx2's transport (bench/aiohttp_transport.py): the switch that keeps every layer above;
- `httpx2-h2`, `httpx2-h1`: httpx2's client alone, the JSON decoded to dicts, no lightkube:
  requests on HTTP/2 and watches on HTTP/1.1 as the driver has them, or HTTP/1.1 alone (what
  lightkube's own layer costs above httpx2);
- `aiohttp`: aiohttp's client alone (HTTP/1.1 keep-alive), the JSON decoded to dicts, no
  lightkube (what replacing lightkube too would cost at best);
- `lightkube-h2-shared` (the stall check only): lightkube on HTTP/2 with the watches on the
  requests' connection, the design WatchingClient avoided.

After the rounds, once a round, a fresh process with the driver's own imports
(cnidra.agent.driver, aiohttp among them) imports lightkube and its models: what they added
to the driver's memory before they were dropped.

Prints a table on stderr; with --json the detail as one JSON line, then the last line:
{"cpu_ms": {transport: {"get_1", "get_10", "apply_1", "apply_10", "cold_10"}},
"latency_ms": {transport: {"get_1_p50", ...}}, "rss_added_mib":
{transport: {"vmrss", "rssanon"}}, "stalls": {transport: count}}, medians over the rounds.
About 2 minutes (2 rounds; --rounds 4: 4.3) on this project's 2-core machine. Figures:
docs/performance.md."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

CLAIMS = 10  # one a worker at 10 in flight
CONCURRENT = 10
WARM_UP = 20
COLD_CLIENTS = 5
WATCHES = 3
STALL_GETS = 30
STALL_SECONDS = 3.0
NAMESPACE = "default"
DRIVER = "transport.bench.example.com"
POOL = "bench-pool"
DEVICE = "dev0"
IDLE_NODE = "no-such-node"  # the watches' node: no pod is ever bound to it
TRANSPORTS = (
    "cnidra",
    "lightkube-h2",
    "lightkube-h1",
    "lightkube-aiohttp",
    "httpx2-h2",
    "httpx2-h1",
    "aiohttp",
)
STALL_ONLY = ("lightkube-h2-shared",)
OPS = ("get_1", "get_10", "apply_1", "apply_10", "cold_10")


# ------------------------------------------------------------------ figures (pure)


def proc_status(text: str | None = None) -> dict[str, int]:
    """VmRSS, RssAnon and RssFile of /proc/self/status (or `text`), in KiB."""
    text = Path("/proc/self/status").read_text() if text is None else text
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            out[key] = int(rest.split()[0])
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks; q in [0, 1]; NaN for none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def op_figures(cpu_s: float, wall_s: float, latencies_s: Sequence[float]) -> dict[str, float]:
    n = len(latencies_s)
    return {
        "n": n,
        "cpu_ms": round(1000 * cpu_s / n, 3) if n else float("nan"),
        "p50_ms": round(1000 * percentile(latencies_s, 0.5), 2),
        "p99_ms": round(1000 * percentile(latencies_s, 0.99), 2),
        "per_s": round(n / wall_s, 1) if wall_s > 0 else float("nan"),
    }


def status_body(name: str, count: int) -> dict[str, Any]:
    """A claim's status as a driver applies it: its device's Ready condition, the message
    changed each time (so every apply is a write)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "status": {
            "devices": [
                {
                    "driver": DRIVER,
                    "pool": POOL,
                    "device": DEVICE,
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "Bench",
                            "message": f"apply {count}",
                            "lastTransitionTime": "2026-01-01T00:00:00Z",
                        }
                    ],
                }
            ]
        },
    }


def claim_object(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "b"}}]}},
    }


def allocation_body(name: str) -> dict[str, Any]:
    """The allocation the scheduler would write (no scheduler runs here)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "r", "driver": DRIVER, "pool": POOL, "device": DEVICE}]
                }
            }
        },
    }


def claim_names() -> list[str]:
    return [f"transport-c{i}" for i in range(CLAIMS)]


def median_of(results: Sequence[Mapping[str, Any]], *path: str) -> float:
    values = []
    for result in results:
        value: Any = result
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        if isinstance(value, int | float):
            values.append(float(value))
    return round(statistics.median(values), 3) if values else float("nan")


def summary(by_transport: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """Medians over the rounds of each transport's figures."""
    cpu: dict[str, dict[str, float]] = {}
    rss: dict[str, dict[str, float]] = {}
    stalls: dict[str, float] = {}
    latency: dict[str, dict[str, float]] = {}
    for name, results in by_transport.items():
        if name not in STALL_ONLY:
            cpu[name] = {op: median_of(results, "ops", op, "cpu_ms") for op in OPS}
            latency[name] = {
                f"{op}_{q}": median_of(results, "ops", op, f"{q}_ms")
                for op in OPS
                for q in ("p50", "p99")
            }
            rss[name] = {
                "vmrss": median_of(results, "rss", "added_vmrss_mib"),
                "rssanon": median_of(results, "rss", "added_rssanon_mib"),
            }
        stalls[name] = median_of(results, "stall", "stalled")
    return {"cpu_ms": cpu, "latency_ms": latency, "rss_added_mib": rss, "stalls": stalls}


def report(line: Mapping[str, Any]) -> str:
    rows = [
        "transport: CPU ms a request (GET 1 / 10 in flight, apply 1 / 10, 10 GETs on a fresh "
        "client); latency p50/p99 ms (GET 1, apply 1); RSS added MiB (VmRSS, RssAnon); stalled "
        "GETs with 3 watches"
    ]
    for name in line["stalls"]:
        if name in line["cpu_ms"]:
            c, lat, r = line["cpu_ms"][name], line["latency_ms"][name], line["rss_added_mib"][name]
            rows.append(
                f"  {name}: CPU {c['get_1']} / {c['get_10']}, {c['apply_1']} / "
                f"{c['apply_10']}, cold {c['cold_10']}; GET {lat['get_1_p50']}/"
                f"{lat['get_1_p99']}, apply "
                f"{lat['apply_1_p50']}/{lat['apply_1_p99']}; RSS +{r['vmrss']} "
                f"(anon +{r['rssanon']}); stalls {line['stalls'][name]}"
            )
        else:
            rows.append(f"  {name}: stalls {line['stalls'][name]}")
    return "\n".join(rows)


# ------------------------------------------------------------------ the child: one transport


class Way(Protocol):
    async def get(self, name: str) -> Any: ...
    async def apply(self, name: str, body: Mapping[str, Any]) -> Any: ...
    def watch(self) -> AsyncIterator[Any]: ...
    async def close(self) -> None: ...


def _kubeconfig(path: str) -> tuple[str, str, str, str]:
    """server, CA, certificate and key of the kubeconfig testbed.pki writes (JSON, files)."""
    config = json.loads(Path(path).read_text())
    cluster = config["clusters"][0]["cluster"]
    user = config["users"][0]["user"]
    return (
        cluster["server"],
        cluster["certificate-authority"],
        user["client-certificate"],
        user["client-key"],
    )


class LightkubeWay:
    """lightkube on httpx2: `mode` h2 (the driver's: requests on HTTP/2, watches on an
    HTTP/1.1 client of their own), h1, aiohttp (httpx2 over bench.aiohttp_transport) or
    h2-shared (watches on the requests' HTTP/2 connection)."""

    def __init__(self, kubeconfig: str, mode: str) -> None:
        import httpx2
        from lightkube import AsyncClient
        from lightkube.config.kubeconfig import KubeConfig

        config = KubeConfig.from_file(kubeconfig)
        timeout = httpx2.Timeout(10.0)

        def client(http2: bool, transport: Any = None) -> AsyncClient:
            return AsyncClient(
                config=config,
                timeout=timeout,
                field_manager="bench",
                http2=http2,
                transport=transport,
            )

        self.config = config
        if mode == "aiohttp":
            from lightkube.config.client_adapter import verify_cluster

            from bench.aiohttp_transport import AiohttpTransport

            single = config.get()
            assert single.user is not None
            context = verify_cluster(single.cluster, single.user, single.abs_file)
            self.requests = client(False, AiohttpTransport(context))
        else:
            self.requests = client(mode in ("h2", "h2-shared"))
        self.watches = client(False) if mode == "h2" else self.requests

    async def first(self, name: str) -> None:
        """One typed GET (lightkube's models imported), before the driver's modules are."""
        from lightkube.resources.resource_v1 import ResourceClaim

        await self.requests.get(ResourceClaim, name, namespace=NAMESPACE)

    async def get(self, name: str) -> Any:
        async with asyncio.timeout(10.0):
            return await self.requests.get(_claim_document(), name, namespace=NAMESPACE)

    async def apply(self, name: str, body: Mapping[str, Any]) -> Any:
        from lightkube.resources.resource_v1 import ResourceClaimStatus
        from lightkube.types import PatchType

        async with asyncio.timeout(10.0):
            return await self.requests.patch(
                ResourceClaimStatus,
                name,
                dict(body),
                namespace=NAMESPACE,
                patch_type=PatchType.APPLY,
                field_manager="bench",
                force=True,
            )

    async def watch(self) -> AsyncIterator[Any]:
        from lightkube import ALL_NS

        fields = {"spec.nodeName": IDLE_NODE}
        async for event, obj in self.watches.watch(
            _pod_document(), namespace=ALL_NS, fields=fields
        ):
            yield str(event), dict(obj)

    async def close(self) -> None:
        await self.requests.close()
        if self.watches is not self.requests:
            await self.watches.close()


def _claim_document() -> Any:
    """resource.k8s.io/v1 ResourceClaim decoded into plain dicts (lightkube's generic
    resource), as the driver's GET was."""
    from lightkube.core.resource import ApiInfo, ResourceDef
    from lightkube.generic_resource import GenericNamespacedResource

    class ClaimDocument(GenericNamespacedResource):
        _api_info = ApiInfo(
            resource=ResourceDef("resource.k8s.io", "v1", "ResourceClaim"),
            plural="resourceclaims",
            verbs=["get"],
        )

    return ClaimDocument


def _pod_document() -> Any:
    from lightkube.core.resource import ApiInfo, ResourceDef
    from lightkube.generic_resource import GenericNamespacedResource

    class PodDocument(GenericNamespacedResource):
        _api_info = ApiInfo(
            resource=ResourceDef("", "v1", "Pod"),
            plural="pods",
            verbs=["global_list", "global_watch", "list", "watch"],
        )

    return PodDocument


class CnidraWay:
    """The driver's own client (cnidra.kube.client.make_client) through cnidra.kube.api.Api:
    the GET as prepare's, the apply as the status writer's, the watch as NodePods'."""

    def __init__(self, kubeconfig: str) -> None:
        from cnidra.kube.api import Api
        from cnidra.kube.client import make_client

        self.client = make_client(kubeconfig, 10.0)
        self.api = Api(self.client, 10.0)

    async def first(self, name: str) -> None:
        await self.get(name)

    async def get(self, name: str) -> Any:
        from cnidra.kube.api import ResourceClaim

        return await self.api.get(ResourceClaim, name, NAMESPACE)

    async def apply(self, name: str, body: Mapping[str, Any]) -> Any:
        from cnidra.kube.api import ResourceClaimStatus

        return await self.api.apply(
            ResourceClaimStatus, name, body, namespace=NAMESPACE, field_manager="bench"
        )

    async def watch(self) -> AsyncIterator[Any]:
        from cnidra.kube.pods import NodePods

        async for item in NodePods(self.client, IDLE_NODE).watch():
            yield item

    async def close(self) -> None:
        await self.client.close()


class AiohttpWay:
    """aiohttp's client alone: HTTP/1.1 keep-alive, JSON decoded to dicts."""

    def __init__(self, kubeconfig: str) -> None:
        import aiohttp

        self.aiohttp = aiohttp
        server, ca, cert, key = _kubeconfig(kubeconfig)
        context = ssl.create_default_context(cafile=ca)
        context.load_cert_chain(cert, key)
        self.server = server
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=10.0),
        )

    def _url(self, name: str, status: bool = False) -> str:
        path = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims/{name}"
        return self.server + path + ("/status" if status else "")

    async def first(self, name: str) -> None:
        await self.get(name)

    async def get(self, name: str) -> Any:
        async with self.session.get(self._url(name)) as response:
            response.raise_for_status()
            return json.loads(await response.read())

    async def apply(self, name: str, body: Mapping[str, Any]) -> Any:
        async with self.session.patch(
            self._url(name, status=True),
            params={"fieldManager": "bench", "force": "true"},
            data=json.dumps(body),
            headers={"Content-Type": "application/apply-patch+yaml"},
        ) as response:
            response.raise_for_status()
            return json.loads(await response.read())

    async def watch(self) -> AsyncIterator[Any]:
        url = f"{self.server}/api/v1/pods"
        params = {"watch": "true", "fieldSelector": f"spec.nodeName={IDLE_NODE}"}
        timeout = self.aiohttp.ClientTimeout(total=None, sock_read=None)
        async with self.session.get(url, params=params, timeout=timeout) as response:
            response.raise_for_status()
            async for line in response.content:
                yield json.loads(line)

    async def close(self) -> None:
        await self.session.close()


class HttpxWay:
    """httpx2's client alone, the JSON decoded to dicts, no lightkube: `http2` as the driver
    has it (requests on one HTTP/2 connection, watches on an HTTP/1.1 client of their own) or
    HTTP/1.1 keep-alive alone."""

    def __init__(self, kubeconfig: str, http2: bool) -> None:
        import httpx2

        self.httpx2 = httpx2
        server, ca, cert, key = _kubeconfig(kubeconfig)
        context = ssl.create_default_context(cafile=ca)
        context.load_cert_chain(cert, key)

        def client(h2: bool) -> httpx2.AsyncClient:
            return httpx2.AsyncClient(
                base_url=server, verify=context, http2=h2, timeout=httpx2.Timeout(10.0)
            )

        self.requests = client(http2)
        self.watches = client(False) if http2 else self.requests

    def _path(self, name: str, status: bool = False) -> str:
        path = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims/{name}"
        return path + ("/status" if status else "")

    async def first(self, name: str) -> None:
        await self.get(name)

    async def get(self, name: str) -> Any:
        response = await self.requests.get(self._path(name))
        response.raise_for_status()
        return json.loads(response.content)

    async def apply(self, name: str, body: Mapping[str, Any]) -> Any:
        response = await self.requests.patch(
            self._path(name, status=True),
            params={"fieldManager": "bench", "force": "true"},
            content=json.dumps(body),
            headers={"Content-Type": "application/apply-patch+yaml"},
        )
        response.raise_for_status()
        return json.loads(response.content)

    async def watch(self) -> AsyncIterator[Any]:
        params = {"watch": "true", "fieldSelector": f"spec.nodeName={IDLE_NODE}"}
        timeout = self.httpx2.Timeout(10.0, read=None)
        async with self.watches.stream(
            "GET", "/api/v1/pods", params=params, timeout=timeout
        ) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                yield json.loads(line)

    async def close(self) -> None:
        await self.requests.aclose()
        if self.watches is not self.requests:
            await self.watches.aclose()


def make_way(name: str, kubeconfig: str) -> Any:
    if name == "cnidra":
        return CnidraWay(kubeconfig)
    if name == "aiohttp":
        return AiohttpWay(kubeconfig)
    if name in ("httpx2-h2", "httpx2-h1"):
        return HttpxWay(kubeconfig, http2=name == "httpx2-h2")
    mode = name.removeprefix("lightkube-")
    if mode not in ("h2", "h1", "aiohttp", "h2-shared"):
        raise SystemExit(f"--child: unknown transport {name!r}: one of {TRANSPORTS + STALL_ONLY}")
    return LightkubeWay(kubeconfig, mode)


async def timed(
    call: Callable[[int, int], Awaitable[Any]], requests: int, concurrent: int
) -> dict[str, float]:
    """`requests` calls, `concurrent` workers at once (worker k's i-th call: call(k, i)), after
    WARM_UP not counted: CPU and latency figures."""
    latencies: list[float] = []

    async def worker(k: int, count: int, record: bool) -> None:
        for i in range(count):
            t = time.perf_counter()
            await call(k, i)
            if record:
                latencies.append(time.perf_counter() - t)

    await asyncio.gather(*(worker(k, WARM_UP // concurrent or 1, False) for k in range(concurrent)))
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(k, requests // concurrent, True) for k in range(concurrent)))
    return op_figures(time.process_time() - cpu, time.perf_counter() - wall, latencies)


async def cold(name: str, kubeconfig: str, names: Sequence[str]) -> dict[str, float]:
    """COLD_CLIENTS fresh clients (made before the clock starts), each sending CONCURRENT GETs
    at once: the connections' cost with them (TLS handshakes: one on HTTP/2, one a request in
    flight on HTTP/1.1), as after the pool's idle connections expired."""
    cpu_s, wall_s = 0.0, 0.0
    latencies: list[float] = []

    async def one(way: Any, claim: str) -> None:
        t = time.perf_counter()
        await way.get(claim)
        latencies.append(time.perf_counter() - t)

    for _ in range(COLD_CLIENTS):
        way = make_way(name, kubeconfig)
        try:
            cpu, wall = time.process_time(), time.perf_counter()
            await asyncio.gather(*(one(way, names[k]) for k in range(CONCURRENT)))
            cpu_s += time.process_time() - cpu
            wall_s += time.perf_counter() - wall
        finally:
            await way.close()
    return op_figures(cpu_s, wall_s, latencies)


async def stall_check(way: Any, names: Sequence[str]) -> dict[str, Any]:
    """WATCHES idle watches held open, then GETs one at a time, each allowed STALL_SECONDS."""

    async def hold() -> None:
        async for _ in way.watch():
            pass

    watches = [asyncio.create_task(hold()) for _ in range(WATCHES)]
    latencies: list[float] = []
    stalled = 0
    try:
        await asyncio.sleep(2.0)  # the watches' requests sent and answered (headers)
        for i in range(STALL_GETS):
            t = time.perf_counter()
            try:
                async with asyncio.timeout(STALL_SECONDS):
                    await way.get(names[i % len(names)])
            except TimeoutError:
                stalled += 1
                if stalled == 3:
                    break
                continue
            latencies.append(time.perf_counter() - t)
        failed = [str(w.exception()) for w in watches if w.done() and w.exception()]
    finally:
        for task in watches:
            task.cancel()
        await asyncio.gather(*watches, return_exceptions=True)
    return {
        "watches": WATCHES,
        "gets": len(latencies) + stalled,
        "stalled": stalled,
        "p50_ms": round(1000 * percentile(latencies, 0.5), 2),
        "max_ms": round(1000 * max(latencies), 2) if latencies else float("nan"),
        "watch_failures": failed,
    }


async def child(name: str, kubeconfig: str, requests: int) -> dict[str, Any]:
    base = proc_status()
    way = make_way(name, kubeconfig)
    names = claim_names()
    try:
        await way.first(names[0])
        loaded = proc_status()
        out: dict[str, Any] = {
            "transport": name,
            "rss": {
                "base_kib": base,
                "loaded_kib": loaded,
                "added_vmrss_mib": round((loaded["VmRSS"] - base["VmRSS"]) / 1024, 1),
                "added_rssanon_mib": round((loaded["RssAnon"] - base["RssAnon"]) / 1024, 1),
            },
            "ops": {},
        }
        if name not in STALL_ONLY:
            count = 0

            async def get(k: int, _: int) -> None:
                await way.get(names[k])

            async def apply(k: int, _: int) -> None:
                nonlocal count
                count += 1
                await way.apply(names[k], status_body(names[k], count))

            for op, call in (("get", get), ("apply", apply)):
                for concurrent in (1, CONCURRENT):
                    out["ops"][f"{op}_{concurrent}"] = await timed(call, requests, concurrent)
            out["ops"]["cold_10"] = await cold(name, kubeconfig, names)
        out["stall"] = await stall_check(way, names)
        out["rss"]["end_kib"] = proc_status()
        return out
    finally:
        await way.close()


# what the driver imported of lightkube before it moved to aiohttp alone: its clients and the
# typed models it read
LIGHTKUBE = "lightkube,lightkube.resources.core_v1,lightkube.resources.resource_v1"


def driver_plus(library: str) -> dict[str, Any]:
    """What importing `library` (modules, comma-separated) adds to a process that has the
    driver's own imports (cnidra.agent.driver): VmRSS and RssAnon, in MiB (run in a fresh
    process: `--driver-plus`)."""
    import importlib

    importlib.import_module("cnidra.agent.driver")
    before = proc_status()
    for module in library.split(","):
        importlib.import_module(module)
    after = proc_status()
    return {
        "library": library,
        "driver_vmrss_mib": round(before["VmRSS"] / 1024, 1),
        "driver_rssanon_mib": round(before["RssAnon"] / 1024, 1),
        "added_vmrss_mib": round((after["VmRSS"] - before["VmRSS"]) / 1024, 2),
        "added_rssanon_mib": round((after["RssAnon"] - before["RssAnon"]) / 1024, 2),
    }


def run_driver_plus(library: str, timeout: float) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench.transport", "--driver-plus", library]
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(__file__).parents[1],
        check=False,
    )
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"--driver-plus {library} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# ------------------------------------------------------------------ the parent


async def prepare_claims(admin: Path) -> None:
    """The claims, each with the allocation a scheduler would have written."""
    from cnidra.kube.api import Api, ResourceClaim, ResourceClaimStatus
    from cnidra.kube.client import make_client

    client = make_client(str(admin), 30.0)
    api = Api(client, 30.0)
    try:
        for name in claim_names():
            await api.create(ResourceClaim, claim_object(name))
            await api.apply(
                ResourceClaimStatus,
                name,
                allocation_body(name),
                namespace=NAMESPACE,
                field_manager="bench-allocator",
            )
            await api.apply(
                ResourceClaimStatus,
                name,
                status_body(name, 0),
                namespace=NAMESPACE,
                field_manager="bench",
            )
    finally:
        await client.close()


def run_child(name: str, admin: Path, requests: int, timeout: float) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench.transport", "--child", name, "--kubeconfig", str(admin)]
    argv += ["--requests", str(requests)]
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(__file__).parents[1],
        check=False,
    )
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"transport {name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for package in ("lightkube", "httpx2", "httpcore2", "h2", "anyio", "aiohttp", "yarl"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = None
    return out


def parent(args: argparse.Namespace) -> dict[str, Any]:
    from bench.fleet import ControlPlane, load_average, say
    from testbed.layout import Bins

    bins = Bins.locate()
    if not (bins.k8s / "kube-apiserver").exists() or not (bins.etcd / "etcd").exists():
        raise SystemExit(f"no built control plane in {bins.k8s} / {bins.etcd}: testbed/build.sh")
    names = [n for n in (*TRANSPORTS, *STALL_ONLY) if not args.only or n in args.only]
    plane = ControlPlane(bins)
    by_transport: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    rounds: list[dict[str, Any]] = []
    try:
        plane.start(scheduler=False)
        asyncio.run(prepare_claims(plane.admin))
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                result = run_child(name, plane.admin, args.requests, args.child_timeout)
                result["round"], result["loadavg_1m"] = r, load_average()
                by_transport[name].append(result)
                rounds.append(result)
                ops = result["ops"]
                say(
                    f"round {r} {name}: "
                    + ", ".join(f"{op} {ops[op]['cpu_ms']} ms CPU" for op in ops)
                    + f"; RSS +{result['rss']['added_vmrss_mib']} MiB; "
                    f"stalled {result['stall']['stalled']} (load {load_average()})"
                )
    finally:
        plane.stop()
    added = [run_driver_plus(LIGHTKUBE, args.child_timeout) for _ in range(args.rounds)]
    return {
        "driver_plus_lightkube": added,
        "requests": args.requests,
        "rounds": rounds,
        "versions": versions(),
        "cpus": os.cpu_count(),
        "summary": summary(by_transport),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.transport", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--requests", type=int, default=400, help="of each kind, counted")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--only",
        type=lambda s: [x for x in s.split(",") if x],
        default=[],
        help=f"a comma-separated subset of {', '.join(TRANSPORTS + STALL_ONLY)}",
    )
    parser.add_argument("--child-timeout", type=float, default=600.0, help="seconds, each")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    parser.add_argument("--driver-plus", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.requests < CONCURRENT or args.requests % CONCURRENT:
        parser.error(f"--requests: a multiple of {CONCURRENT}")
    if args.driver_plus:
        print(json.dumps(driver_plus(args.driver_plus)))
        return 0
    if args.child:
        print(json.dumps(asyncio.run(child(args.child, args.kubeconfig, args.requests))))
        return 0
    unknown = set(args.only) - set(TRANSPORTS + STALL_ONLY)
    if unknown:
        parser.error(f"--only: unknown {sorted(unknown)}")
    detail = parent(args)
    print(report(detail["summary"]), file=sys.stderr)
    for added in detail["driver_plus_lightkube"]:
        print(
            f"lightkube imported beside the driver's imports ({added['driver_vmrss_mib']} MiB "
            f"VmRSS): +{added['added_vmrss_mib']} MiB VmRSS, +{added['added_rssanon_mib']} MiB "
            "RssAnon",
            file=sys.stderr,
        )
    if args.json:
        from bench.fleet import finite

        print(json.dumps(finite(detail), sort_keys=True, allow_nan=False))
        print(json.dumps(finite(detail["summary"]), allow_nan=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
