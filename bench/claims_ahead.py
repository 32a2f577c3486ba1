"""One node's claims read ahead, at rest (issue 42): the driver's read-ahead as `cnidra driver`
wires it (cnidra.dra.ahead.ReadAhead on the node-scoped pod watch, cnidra.kube.pods.NodePods,
reading with prepare's ClaimGetter into a ClaimsAhead, on the driver's own client), in a
process of its own so that its memory is the driver's shape and not the benchmark's. The
claims are read and kept, not judged: the driver's judge (Preparer.warm) fills prepare's own
verdict cache, which is not measured here.

    python -m bench.claims_ahead --kubeconfig FILE --node NAME --pods N [--seconds 300] [--json]

bench.fleet runs it (step 3b, beside the sample at rest) on a node with N pods bound, each
with a claim allocated and reserved for it, and pods with claims bound to every other node.
It reads VmRSS, RssAnon and RssFile (/proc/self/status) after the client's first GET (the
client connected, the libraries loaded: `before`), once the N claims are read and kept
(`read`), and after --seconds at rest (`rest`); the Python objects the cache and the
read-ahead hold (a deep size of ClaimsAhead's and ReadAhead's own tables, the claims
included); and every request the client sends, by kind, at start and during the --seconds at
rest (per minute). Prints one JSON line."""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import json
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import aiohttp

from bench.transport import proc_status
from cnidra.dra.ahead import ClaimsAhead, ReadAhead
from cnidra.kube.api import Api, Namespace
from cnidra.kube.claims import ClaimGetter
from cnidra.kube.client import make_client
from cnidra.kube.pods import NodePods
from cnidra.observe.metrics import request_kind

READ_TIMEOUT = 120.0  # seconds for the N claims to be read ahead


def deep_size(obj: object, seen: set[int] | None = None) -> int:
    """Bytes of `obj` and everything it holds (containers, instances' __dict__ and __slots__),
    each object once."""
    seen = set() if seen is None else seen
    stack = [obj]
    total = 0
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            stack.extend(item)
        elif not isinstance(item, str | bytes | int | float | bool | type(None)):
            if hasattr(item, "__dict__"):
                stack.append(vars(item))
            for slot in getattr(type(item), "__slots__", ()):
                if hasattr(item, slot):
                    stack.append(getattr(item, slot))
    return total


def tables(cache: ClaimsAhead, reader: ReadAhead) -> list[object]:
    """What the read-ahead keeps between pods: the claims by UID with their resourceVersions,
    the names' UIDs, the newest versions seen, and the (pod, claim) pairs read."""
    return [cache._entries, cache._uids, cache._newest, reader._read]


def managed_fields(claim: Any) -> object:
    """A kept claim's metadata.managedFields (the apiserver's record of who set which field,
    which nothing in prepare reads): what of `held` they are."""
    meta = claim.get("metadata") if isinstance(claim, dict) else None
    return meta.get("managedFields", []) if isinstance(meta, dict) else []


def kib_to_mib(kib: int) -> float:
    return round(kib / 1024, 2)


def per_minute(count: int, seconds: float) -> float:
    return round(count * 60 / seconds, 3) if seconds > 0 else float("nan")


class Log:
    """Each request the client sends: when, and what (verb resource)."""

    def __init__(self) -> None:
        self.entries: list[tuple[float, str]] = []

    async def record(
        self, _session: Any, _context: Any, params: aiohttp.TraceRequestStartParams
    ) -> None:
        verb, resource = request_kind(
            params.method,
            params.url.path,
            params.url.query_string,
            params.headers.get("Content-Type", ""),
        )
        self.entries.append((time.monotonic(), f"{verb} {resource}"))

    def tracer(self) -> aiohttp.TraceConfig:
        """An aiohttp trace that records each request a session sends."""
        trace = aiohttp.TraceConfig()
        trace.on_request_start.append(self.record)
        return trace

    def between(self, start: float, end: float) -> Counter[str]:
        return Counter(kind for t, kind in self.entries if start <= t < end)


def hook(client: Any, log: Log) -> None:
    """On the driver's one session: its requests and its watches."""
    client.trace_configs.append(log.tracer())


async def measure(
    kubeconfig: str, node: str, pods: int, seconds: float, client: Any = None
) -> dict[str, Any]:
    """`client`: the driver's (make_client from `kubeconfig`) unless a test gives one."""
    client = make_client(kubeconfig, 30.0) if client is None else client
    log = Log()
    hook(client, log)
    cache = ClaimsAhead()
    getter = ClaimGetter(client, 30.0)
    reader = ReadAhead(NodePods(client, node).watch, getter, cache)
    try:
        await Api(client).get(Namespace, "default")  # connected, decoding loaded
        gc.collect()
        before = proc_status()
        started = time.monotonic()
        task = asyncio.create_task(reader.run(), name="claims-ahead")
        while len(cache) < pods and time.monotonic() - started < READ_TIMEOUT:
            if task.done():
                task.result()  # its failure, raised
            await asyncio.sleep(0.1)
        read_s = time.monotonic() - started
        await reader.drained()
        gc.collect()
        read = proc_status()
        held = deep_size(tables(cache, reader))
        managed = sum(deep_size(managed_fields(e.claim)) for e in cache._entries.values())
        rest_start = time.monotonic()
        await asyncio.sleep(seconds)
        rest_end = time.monotonic()
        gc.collect()
        rest = proc_status()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    finally:
        await client.close()
    startup = log.between(0.0, rest_start)
    at_rest = log.between(rest_start, rest_end)
    return {
        "node": node,
        "pods": pods,
        "claims_kept": len(cache),
        "claims_read": reader.reads,
        "read_failures": reader.failed,
        "watch_failures": reader.watch_failures,
        "read_s": round(read_s, 2),
        "kib": {"before": before, "read": read, "rest": rest},
        "vmrss_mib": kib_to_mib(rest["VmRSS"]),
        "rssanon_mib": kib_to_mib(rest["RssAnon"]),
        "added_vmrss_mib": kib_to_mib(rest["VmRSS"] - before["VmRSS"]),
        "added_rssanon_mib": kib_to_mib(rest["RssAnon"] - before["RssAnon"]),
        "held_kib": round(held / 1024, 1),
        "held_bytes_per_claim": round(held / len(cache)) if len(cache) else None,
        "managed_fields_kib": round(managed / 1024, 1),
        "startup_requests": dict(sorted(startup.items())),
        "rest_seconds": round(rest_end - rest_start, 1),
        "rest_requests_per_min": per_minute(sum(at_rest.values()), rest_end - rest_start),
        "rest_by_kind": dict(sorted(at_rest.items())),
    }


def die_with_parent() -> None:
    """PR_SET_PDEATHSIG: killed with bench.fleet, whatever stops it."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.claims_ahead", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--pods", type=int, required=True, help="claims to wait for")
    parser.add_argument("--seconds", type=float, default=300.0, help="at rest, counted")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    die_with_parent()
    result = asyncio.run(measure(args.kubeconfig, args.node, args.pods, args.seconds))
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
