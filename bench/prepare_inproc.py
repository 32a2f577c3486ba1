"""NodePrepareResources without the test bed: the driver's own cost (not a test: numbers).

    python -m bench.prepare_inproc [--json] [--rounds 200] [--batches 20] [--claims 1000]
                                   [--distinct] [--ahead] [--state-root /var/tmp]
                                   [--run-root /dev/shm]
                                   [--cprofile FILE] [--pyspy FILE]

Three processes, as on a node: this one is the driver's prepare path, wired as
`cnidra.agent.driver.Driver` wires it (ClaimGetter on the driver's own lightkube client over
HTTP/2 and TLS, the durable checkpoint, device metadata with the container gate, the IPAM
allocator, the network reader) and served by the DRA gRPC service on a unix socket; a fake
apiserver (`bench.fake_apiserver`) answers every claim GET at once; a kubelet stand-in calls
NodePrepareResources and NodeUnprepareResources over gRPC and times them.

The claims are what the apiserver hands back for a pod's claim made from a template, allocated
by the scheduler: managedFields, owner reference, the DeviceClass's CNIPolicy copied into the
allocation next to the claim's CNIConfig (macvlan with cnidra IPAM, tuning, as in
examples/macvlan-claim.yaml), a share ID. By default they share one template's config, as a
Deployment's pods do; `--distinct` gives every claim a config of its own (a network name each).

The claims' network takes its addresses from cnidra's cluster IPAM at prepare, a CNIIPPool of
198.18.192.0/20 serving the claims' namespace, which the fake apiserver serves with its blocks
(their LIST and CREATE, and the Node the blocks are owned by): host-local written by a claim is
refused (bench/pools.py). So prepare includes the allocation, as on a node: the leases written
to the IPAM store's log (one fsync for a call's claims), the pool's GET (kept 10 s), a block's
LIST and CREATE each 16 addresses (with `--ahead`, reserved when the claims are "bound", as the
driver's read-ahead does, unless the kubelet stand-in's call comes first). Runs from before
this had host-local in the claims, which prepare only passed on: prepare's figures are not
comparable with them (`apiserver_requests` counts the requests by method).

`--ahead` models the driver's read-ahead (cnidra.dra.ahead, on by default in `cnidra driver`):
the driver reads every claim once at start, as it does when a claim's pod is bound, and puts
each claim of a NodePrepareResources into its `ClaimsAhead` and judges it there
(`Preparer.warm`, as the read-ahead does after its GET) before the kubelet stand-in makes the
call, which waits for that (its pod "bound" first; the read-ahead's entries are used once);
prepare then finds them there, checks their UID and resourceVersion instead of a GET, and takes
the judgement made on the node's view when the view is still that one. The driver's CPU counts
the cache's `put` and that judging (work the node does when the pod is bound, before kubelet
asks) but not the read-ahead's GET.

Phases: `--rounds` single-claim prepares (each unprepared after), `--batches` prepares of 100
claims (unprepared after), then all `--claims` prepared in batches of 100 and the driver's RSS
read with them held. The last line printed is one JSON object: prepare_1_p50_ms/p99_ms,
prepare_100_p50_ms/p99_ms (as kubelet sees them), the same inside the driver (`driver_*`), the
driver's CPU per call with its unprepare (every thread), rss_idle_mib (wired, warmed, nothing
prepared) and rss_mib with all the claims prepared. The state and kubelet's plugin directory go
under --state-root (a disk, as on a node), the CDI specs and the device metadata files beside
them under --run-root (a tmpfs, as /var/run/cdi is). This process imports every module `cnidra
driver` imports, so its RSS counts the same libraries; it does not run the driver's other parts
(publisher, NRI, HTTP endpoint, status writer), which the real driver's idle RSS adds
(docs/performance.md).

`--cprofile FILE` writes cProfile statistics of the event loop's thread over the measured
phases; `--pyspy FILE` records a py-spy flame graph (SVG; collapsed stacks for a
FILE ending in .txt) of this process over them, every thread (py-spy is not a dependency:
`pip install py-spy`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

from bench.pools import cnidra_ipam, pool_object
from bench.stats import pct, summary

DRIVER = "cni.dra.networking.x-k8s.io"
NODE = "bench-node"
LINK = "ens4"
NAMESPACE = "bench"
BATCH = 100
POOL = "bench-prepare-inproc"
SUBNET = "198.18.192.0/20"  # 4096 addresses: --claims prepared at once
MAX_CLAIMS = 4000
IPAM_API = "/apis/cni.networking.x-k8s.io/v1alpha1"


# ------------------------------------------------------------------ the claims


def class_configs() -> list[dict[str, Any]]:
    """The shipped DeviceClass's configs (its CNIPolicy), as the scheduler copies them."""
    import yaml

    root = Path(__file__).resolve().parent.parent
    docs = yaml.safe_load_all((root / "deploy" / "deviceclass.yaml").read_text())
    return [
        c
        for doc in docs
        if doc and doc["metadata"]["name"] == "cni.networking.x-k8s.io"
        for c in doc["spec"].get("config", [])
    ]


def cni_config(index: int, distinct: bool) -> dict[str, Any]:
    """examples/macvlan-claim.yaml's CNIConfig (its address from POOL); with `distinct` a
    network name of its own."""
    return {
        "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
        "kind": "CNIConfig",
        "ifName": "net1",
        "config": {
            "cniVersion": "1.0.0",
            "name": f"macvlan-data-{index}" if distinct else "macvlan-data",
            "plugins": [
                {"type": "macvlan", "mode": "bridge", "ipam": cnidra_ipam(POOL)},
                {"type": "tuning", "sysctl": {"net.ipv6.conf.net1.disable_ipv6": "1"}},
            ],
        },
    }


def pool() -> dict[str, Any]:
    """The admin's CNIIPPool the claims take their addresses from."""
    return pool_object(POOL, SUBNET, [NAMESPACE], gateway="198.18.192.1")


def ipam_objects() -> dict[str, Any]:
    """What prepare's IPAM asks the apiserver for, by path: the pool, the collection of blocks
    (empty: the node reserves its own), and the Node the blocks are owned by."""
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE, "uid": str(uuid.uuid4())},
    }
    blocks = {
        "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
        "kind": "CNIIPBlockList",
        "metadata": {},
        "items": [],
    }
    return {
        f"{IPAM_API}/cniippools/{POOL}": pool(),
        f"{IPAM_API}/cniipblocks": blocks,
        f"/api/v1/nodes/{NODE}": node,
    }


def policy_samples() -> list[dict[str, Any]]:
    """What the run sends, for tests/bench's check against the shipped policy."""
    return [pool(), claim(0, False, class_configs()), claim(1, True, class_configs())]


SELECTOR = (
    f'device.attributes["{DRIVER}"].type == "physical" && '
    f'device.attributes["{DRIVER}"].state == "up"'
)
STAMP = "2026-05-04T10:20:30Z"


def claim(index: int, distinct: bool, policy: list[dict[str, Any]]) -> dict[str, Any]:
    """A pod's claim as a GET returns it: made from the pod's template by the resourceclaim
    controller, allocated by the scheduler to this node, reserved for the pod."""
    pod, pod_uid = f"app-{index:04d}", str(uuid.uuid4())
    name = f"{pod}-data-{uuid.uuid4().hex[:5]}"
    opaque = {"driver": DRIVER, "parameters": cni_config(index, distinct)}
    request = {
        "name": "macvlan",
        "exactly": {
            "deviceClassName": "cni.networking.x-k8s.io",
            "selectors": [{"cel": {"expression": SELECTOR}}],
            "allocationMode": "ExactCount",
            "count": 1,
        },
    }
    spec_fields = {
        "f:devices": {
            "f:config": {},
            "f:requests": {},
        }
    }
    status_fields = {
        "f:allocation": {
            ".": {},
            "f:allocationTimestamp": {},
            "f:devices": {".": {}, "f:config": {}, "f:results": {}},
            "f:nodeSelector": {},
        },
        "f:reservedFor": {
            ".": {},
            f'k:{{"resource":"pods","name":"{pod}","uid":"{pod_uid}"}}': {
                ".": {},
                "f:name": {},
                "f:resource": {},
                "f:uid": {},
            },
        },
    }
    return {
        "kind": "ResourceClaim",
        "apiVersion": "resource.k8s.io/v1",
        "metadata": {
            "name": name,
            "generateName": f"{pod}-data-",
            "namespace": NAMESPACE,
            "uid": str(uuid.uuid4()),
            "resourceVersion": str(100000 + index),
            "creationTimestamp": STAMP,
            "annotations": {"resource.kubernetes.io/pod-claim-name": "data"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod,
                    "uid": pod_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "finalizers": ["resource.kubernetes.io/delete-protection"],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "resource.k8s.io/v1",
                    "time": STAMP,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {
                            "f:annotations": {
                                ".": {},
                                "f:resource.kubernetes.io/pod-claim-name": {},
                            },
                            "f:generateName": {},
                            "f:ownerReferences": {
                                ".": {},
                                f'k:{{"uid":"{pod_uid}"}}': {},
                            },
                        },
                        "f:spec": spec_fields,
                    },
                },
                {
                    "manager": "kube-scheduler",
                    "operation": "Update",
                    "apiVersion": "resource.k8s.io/v1",
                    "time": STAMP,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:finalizers": {}}, "f:status": status_fields},
                    "subresource": "status",
                },
            ],
        },
        "spec": {
            "devices": {
                "requests": [request],
                "config": [{"requests": ["macvlan"], "opaque": opaque}],
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "macvlan",
                            "driver": DRIVER,
                            "pool": NODE,
                            "device": LINK,
                            "shareID": str(uuid.uuid4()),
                            "consumedCapacity": {"subInterfaces": "1"},
                        }
                    ],
                    "config": [
                        *(
                            {"source": "FromClass", "requests": ["macvlan"], **copy.deepcopy(c)}
                            for c in policy
                        ),
                        {"source": "FromClaim", "requests": ["macvlan"], "opaque": opaque},
                    ],
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [NODE]}
                            ]
                        }
                    ]
                },
                "allocationTimestamp": STAMP,
            },
            "reservedFor": [{"resource": "pods", "name": pod, "uid": pod_uid}],
        },
    }


def make_claims(into: Path, count: int, distinct: bool) -> None:
    """The fake apiserver's objects (path: claim) and kubelet's references to them."""
    policy = class_configs()
    claims = [claim(i, distinct, policy) for i in range(count)]
    objects = {**{claim_path(c): c for c in claims}, **ipam_objects()}  # a claim first
    (into / "objects.json").write_text(json.dumps(objects))
    (into / "refs.json").write_text(
        json.dumps([[c["metadata"][k] for k in ("namespace", "name", "uid")] for c in claims])
    )


def claim_path(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"/apis/resource.k8s.io/v1/namespaces/{meta['namespace']}/resourceclaims/{meta['name']}"


# ------------------------------------------------------------------ the kubelet stand-in


def kubelet(socket: str, refs_file: str, rounds: int, batches: int) -> None:
    """Times NodePrepareResources as kubelet calls it; says each phase on stdout (the driver
    process reads its CPU at each), and the timings last. Runs in its own process."""
    import grpc

    from bench import grpc_stubs as dra_grpc
    from cnidra._proto.dra.v1 import api_pb2 as dra

    refs = json.loads(Path(refs_file).read_text())
    claims = [dra.Claim(namespace=r[0], name=r[1], uid=r[2]) for r in refs]

    def say(line: str) -> None:
        print(line, flush=True)
        sys.stdin.readline()  # the driver has read its CPU

    def prepare(stub: Any, batch: list[Any]) -> float:
        # the pod is bound first: the driver reads its claims ahead (with --ahead), untimed
        print("bind " + json.dumps([c.uid for c in batch]), flush=True)
        sys.stdin.readline()
        start = time.perf_counter()
        reply = stub.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=batch), timeout=60)
        took = (time.perf_counter() - start) * 1000
        errors = [reply.claims[c.uid].error for c in batch if reply.claims[c.uid].error]
        assert not errors, errors[:3]
        return took

    def unprepare(stub: Any, batch: list[Any]) -> None:
        reply = stub.NodeUnprepareResources(
            dra.NodeUnprepareResourcesRequest(claims=batch), timeout=60
        )
        errors = [reply.claims[c.uid].error for c in batch if reply.claims[c.uid].error]
        assert not errors, errors[:3]

    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = dra_grpc.DRAPluginStub(channel)
        for i in range(3):  # warm: connections, caches, the first files
            prepare(stub, claims[i * BATCH : (i + 1) * BATCH])
            unprepare(stub, claims[i * BATCH : (i + 1) * BATCH])
        say("idle")
        one: list[float] = []
        for r in range(rounds):
            batch = [claims[(r * 7) % len(claims)]]
            one.append(prepare(stub, batch))
            unprepare(stub, batch)
        say("one")
        hundred: list[float] = []
        for b in range(batches):
            start = (b * BATCH) % (len(claims) - BATCH + 1)
            batch = claims[start : start + BATCH]
            hundred.append(prepare(stub, batch))
            unprepare(stub, batch)
        say("hundred")
        for i in range(0, len(claims), BATCH):
            prepare(stub, claims[i : i + BATCH])
        say("all")
    print(json.dumps({"one": one, "hundred": hundred}), flush=True)


# ------------------------------------------------------------------ the driver's side


def rss_mib() -> float:
    gc.collect()
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def timed(call: Any, times: dict[int, list[float]]) -> Any:
    """The DRA service's prepare, timed inside the driver (what its latency metric sees)."""

    async def prepare(request: Any, context: Any) -> Any:
        start = time.perf_counter()
        try:
            return await call(request, context)
        finally:
            took = (time.perf_counter() - start) * 1000
            times.setdefault(len(request.claims), []).append(took)

    return prepare


async def read_ahead(preparer: Any, refs: Path) -> Any:
    """Every claim read once, as the driver's read-ahead reads a claim when its pod is bound
    (the same GET), and what puts a request's claims into the preparer's ClaimsAhead and judges
    them there (`Preparer.warm`, as the read-ahead does after its GET)."""
    from cnidra.dra.ahead import ClaimsAhead

    preparer.ahead = ClaimsAhead(size=MAX_CLAIMS)
    read: dict[str, Any] = {}
    for namespace, name, uid in json.loads(refs.read_text()):
        claim = await preparer.claims.get(namespace, name)
        assert claim is not None and claim["metadata"]["uid"] == uid
        read[uid] = claim

    async def put(uids: list[str]) -> None:
        for uid in uids:
            claim = read[uid]
            preparer.ahead.put(claim)
            await preparer.warm(claim)  # as the read-ahead judges it once it is read

    return put


async def child(stack: contextlib.AsyncExitStack, *argv: str) -> asyncio.subprocess.Process:
    """A helper process (this checkout's modules), ended with the benchmark whatever happens."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", *argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )

    async def end() -> None:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

    stack.push_async_callback(end)
    return proc


def wire(client: Any, tmp: Path, run: Path) -> tuple[Any, Any]:
    """The prepare path as cnidra.agent.driver.Driver wires it, with the driver's defaults
    (device metadata and the container gate on); the node's view fixed: one data link. The
    state and kubelet's plugin directory under `tmp`, the CDI specs under `run` (a node's
    /var/run/cdi is on a tmpfs)."""
    from cnidra.api.nodes import NodeView
    from cnidra.dra.plugin import DRAService
    from cnidra.dra.prepare import Preparer
    from cnidra.ipam.allocator import Allocator
    from cnidra.kube.claims import ClaimGetter, NamespaceGetter
    from cnidra.kube.ipam import KubeIPAM
    from cnidra.kube.networks import NetworkReader
    from cnidra.state import gate as gate_script
    from cnidra.state.checkpoint import Checkpoint
    from cnidra.state.ipam import IPAMState
    from cnidra.state.layout import StateLayout
    from cnidra.status.metadata import DeviceMetadata

    layout = StateLayout(tmp / "state")
    gate_script.install(layout.gate)
    metadata = DeviceMetadata(
        tmp / "plugins",
        run / "cdi",
        mounts=True,
        gate=gate_script.hook_args(layout.gate, layout.sandboxes),
    )
    attributes = {
        LINK: {
            "ifName": {"string": LINK},
            "nodeLink": {"bool": False},
            "type": {"string": "physical"},
            "state": {"string": "up"},
            "mtu": {"int": 1500},
            "mac": {"string": "52:54:00:12:34:56"},
        }
    }
    view = NodeView({LINK: LINK}, frozenset({"eth0"}), {"kubernetes.io/hostname": NODE}, attributes)
    preparer = Preparer(
        NODE,
        ClaimGetter(client, 5.0),
        Checkpoint(layout),
        layout.private_dirs(),
        view=lambda: view,
        namespaces=NamespaceGetter(client, 5.0),
        metadata=metadata,
        networks=NetworkReader(client, tmp / "net.d", 5.0),
        ipam=Allocator(NODE, IPAMState(layout), KubeIPAM(client, 5.0)),
    )
    return preparer, DRAService(preparer)


async def drive(args: argparse.Namespace, tmp: Path, run: Path) -> dict[str, Any]:
    import cnidra.agent.driver
    import cnidra.cli.main  # noqa: F401 - what `cnidra driver` loads, for its RSS
    from bench import fake_apiserver
    from cnidra.kube.client import make_client
    from cnidra.util.memory import cap_malloc_arenas, settle_gc
    from cnidra.util.rpc import RPCServer

    cap_malloc_arenas()  # as the driver does at start
    # made by another process: 1000 claims' dicts would stay in this one's heap
    objects, refs = tmp / "objects.json", tmp / "refs.json"
    make = ["--make-claims", str(tmp), "--claims", str(args.claims)]
    subprocess.run(
        [sys.executable, "-m", "bench.prepare_inproc", *make, *(["--distinct"] * args.distinct)],
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    out: dict[str, Any] = {
        "claim_bytes": len(json.dumps(next(iter(json.loads(objects.read_text()).values())))),
        "distinct_configs": args.distinct,
        "read_ahead": args.ahead,
    }
    cert, key = fake_apiserver.certificate(tmp)
    async with contextlib.AsyncExitStack() as stack:
        apiserver = await child(
            stack, "bench.fake_apiserver",
            "--objects", str(objects), "--cert", str(cert), "--key", str(key),
        )  # fmt: skip
        assert apiserver.stdout is not None and apiserver.stdin is not None
        port = int(await apiserver.stdout.readline())
        config = tmp / "kubeconfig"
        config.write_text(json.dumps(fake_apiserver.kubeconfig(port, cert)))
        client = make_client(str(config), 10.0)
        preparer, service = wire(client, tmp, run)
        settle_gc()  # as the driver does once started, before the node's claims
        times: dict[int, list[float]] = {}
        ahead = await read_ahead(preparer, refs) if args.ahead else None
        service.node_prepare_resources = timed(service.node_prepare_resources, times)
        server = RPCServer(service.methods())  # as the driver serves it
        socket = tmp / "dra.sock"
        await server.start(socket)
        stack.push_async_callback(server.stop, None)
        kubelet_proc = await child(
            stack, "bench.prepare_inproc", "--kubelet", str(socket), "--refs", str(refs),
            "--rounds", str(args.rounds), "--batches", str(args.batches),
        )  # fmt: skip
        cpu, timings = await follow(
            kubelet_proc, args, out, times, len_of=preparer.checkpoint, ahead=ahead
        )
        if preparer.ahead is not None:
            out["read_ahead_hits"] = preparer.ahead.hits
        if await kubelet_proc.wait():
            raise SystemExit(f"the kubelet stand-in failed ({kubelet_proc.returncode})")
        apiserver.stdin.close()
        served = json.loads((await apiserver.stdout.readline()) or b"{}")
        await apiserver.wait()
    one, hundred = timings["one"], timings["hundred"]
    out.update(
        {
            "prepare_1_p50_ms": round(pct(one, 0.5), 2),
            "prepare_1_p99_ms": round(pct(one, 0.99), 2),
            "prepare_100_p50_ms": round(pct(hundred, 0.5), 2),
            "prepare_100_p99_ms": round(pct(hundred, 0.99), 2),
            "prepare_1_ms": summary(one),
            "prepare_100_ms": summary(hundred),
            # the driver's CPU per prepare (with its unprepare), every thread
            "driver_cpu_1_ms": round((cpu["one"] - cpu["idle"]) * 1000 / max(len(one), 1), 2),
            "driver_cpu_100_ms": round(
                (cpu["hundred"] - cpu["one"]) * 1000 / max(len(hundred), 1), 2
            ),
            "apiserver_gets": served.get("GET", 0),
            "apiserver_requests": served,
        }
    )
    return out


async def bound(kubelet_proc: asyncio.subprocess.Process, ahead: Any, uids: list[str]) -> None:
    """The claims of a pod just bound read ahead (with --ahead), then the stand-in told."""
    assert kubelet_proc.stdin is not None
    if ahead is not None:
        await ahead(uids)
    kubelet_proc.stdin.write(b"\n")
    await kubelet_proc.stdin.drain()


async def follow(
    kubelet_proc: asyncio.subprocess.Process,
    args: argparse.Namespace,
    out: dict[str, Any],
    times: dict[int, list[float]],
    len_of: Any,
    ahead: Any = None,
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """The kubelet stand-in's phases: the driver's CPU at each, RSS idle and with every claim
    prepared, the profilers over the measured phases; its timings at the end."""
    assert kubelet_proc.stdout is not None and kubelet_proc.stdin is not None
    profiler: Any = None
    spy: asyncio.subprocess.Process | None = None
    cpu: dict[str, float] = {}
    idle_snapshot: tracemalloc.Snapshot | None = None
    while True:
        line = (await kubelet_proc.stdout.readline()).decode().strip()
        if not line:
            raise SystemExit("the kubelet stand-in ended early")
        if line.startswith("{"):
            return cpu, json.loads(line)
        if line.startswith("bind "):  # a pod bound: its claims read ahead (--ahead) first
            await bound(kubelet_proc, ahead, json.loads(line[len("bind ") :]))
            continue
        if line == "idle":
            out["rss_idle_mib"] = rss_mib()
            if args.tracemalloc:
                tracemalloc.start(8)
                idle_snapshot = tracemalloc.take_snapshot()
            times.clear()
            if args.pyspy:
                beside = Path(sys.executable).with_name("py-spy")  # installed in the venv
                program = str(beside) if beside.exists() else "py-spy"
                spy = await asyncio.create_subprocess_exec(
                    program, "record", "--pid", str(os.getpid()), "--rate", "500",
                    "--format", "raw" if args.pyspy.suffix == ".txt" else "flamegraph",
                    "--output", str(args.pyspy),
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
                await asyncio.sleep(2)
            if args.cprofile:
                import cProfile

                profiler = cProfile.Profile()
                profiler.enable()
        elif line == "one":
            out["driver_prepare_1_ms"] = summary(times.pop(1, [0.0]))
        elif line == "hundred":
            out["driver_prepare_100_ms"] = summary(times.pop(BATCH, [0.0]))
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(args.cprofile)
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                await spy.wait()
        elif line == "all":
            out[f"rss_{len(len_of)}_prepared_mib"] = out["rss_mib"] = rss_mib()
            if idle_snapshot is not None:
                gc.collect()
                held = tracemalloc.take_snapshot().compare_to(idle_snapshot, "traceback")
                args.tracemalloc.write_text(
                    "\n\n".join(
                        f"{stat.size_diff / 1024:.0f} KiB in {stat.count_diff} blocks\n"
                        + "\n".join(stat.traceback.format())
                        for stat in held[:40]
                    )
                )
                tracemalloc.stop()
        cpu[line] = time.process_time()
        kubelet_proc.stdin.write(b"\n")
        await kubelet_proc.stdin.drain()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", action="store_true", help="one line")
    parser.add_argument("--rounds", type=int, default=200, help="single-claim prepares")
    parser.add_argument("--batches", type=int, default=20, help="100-claim prepares")
    parser.add_argument("--claims", type=int, default=1000, help="prepared for the RSS")
    parser.add_argument("--distinct", action="store_true", help="a config per claim")
    parser.add_argument(
        "--ahead", action="store_true", help="claims read ahead (the driver's default), no GET"
    )
    parser.add_argument(
        "--state-root",
        type=Path,
        default=Path("/var/tmp"),
        help="where the state and kubelet's plugin directory go (a disk, as on a node)",
    )
    parser.add_argument(
        "--run-root",
        type=Path,
        default=Path("/dev/shm"),
        help="where the CDI specs go (a tmpfs, as /var/run/cdi on a node)",
    )
    parser.add_argument("--cprofile", type=Path, help="cProfile stats of the measured phases")
    parser.add_argument("--pyspy", type=Path, help="py-spy flame graph (SVG) of them")
    parser.add_argument(
        "--tracemalloc",
        type=Path,
        help="what holds the memory the prepared claims add, by source line, here (text)",
    )
    parser.add_argument("--kubelet", help=argparse.SUPPRESS)
    parser.add_argument("--refs", help=argparse.SUPPRESS)
    parser.add_argument("--make-claims", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.make_claims:
        make_claims(args.make_claims, args.claims, args.distinct)
        return
    if args.kubelet:
        kubelet(args.kubelet, args.refs, args.rounds, args.batches)
        return
    if not 3 * BATCH <= args.claims <= MAX_CLAIMS:
        parser.error(f"--claims must be {3 * BATCH} to {MAX_CLAIMS} (the addresses of {SUBNET})")
    tmp = Path(tempfile.mkdtemp(prefix="cnidra-prepare-bench-", dir=args.state_root))
    run = Path(tempfile.mkdtemp(prefix="cnidra-prepare-bench-", dir=args.run_root))
    try:
        results = asyncio.run(drive(args, tmp, run))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(run, ignore_errors=True)
    print(json.dumps(results) if args.json else json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
