"""The driver's latencies and memory on the real test bed (not a test: numbers, one run).

    python -m bench.driver_latency [--json] [--pods 50] [--rounds 30]

prepare   NodePrepareResources latency over gRPC, as kubelet calls it, with the claims already
          in the driver's watch cache: 1 claim per call and 100 claims per call (p50/p99).
memory    the driver's resident memory idle and with 1000 prepared claims.
hook      time inside the RunPodSandbox hook per pod, 1 and 3 attachments (macvlan), next to
          the raw CNI time of macvlan + host-local exec'd directly.
pod-ready creation-to-Ready latency of N pods created at once, with and without a cnidra
          attachment (p50/p99/max).

The claims' networks take their addresses from cnidra's cluster IPAM (host-local written by a
claim is refused; bench/pools.py): CNIIPPools made for the run, 198.18.32.0/19 for the
prepared claims and 198.18.100.0/24 to 198.18.102.0/24 for the pods' attachments, deleted after
it. So prepare now includes the allocation (the leases written to the IPAM store's log, one
fsync for a call's claims, and, for a claim not read ahead, a block LIST and CREATE each time
the node's blocks of 16 are full: the read-ahead reserves those before kubelet asks,
`read_ahead.blocks_reserved`), and inside the hook the
plugins run macvlan with the static IPAM plugin prepare wrote them, where before they ran
host-local; the raw side still execs macvlan + host-local, as a node without cnidra would.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
import subprocess
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import yaml

from bench import grpc_stubs as dra_grpc
from bench.pools import cnidra_ipam, delete_pool, in_namespace, pool_name, pool_object
from bench.profile import profiled
from bench.stats import pct, summary
from cnidra._proto.dra.v1 import api_pb2 as dra
from cnidra.cni import netns
from testbed import cluster as tb
from testbed.harness import ROOT, Cluster, DriverProcess

DRIVER = "cni.dra.networking.x-k8s.io"
NODE = tb.NODE
PREPARE_SUBNET = "198.18.32.0/19"  # --claims prepared at once: 8192 addresses
AHEAD_SUBNET = "198.18.64.0/22"  # the claims read ahead: 1024 addresses
READY_SUBNETS = [f"198.18.{100 + a}.0/24" for a in range(3)]  # the pods' attachments


def apply_many(bed: Cluster, docs: list[dict[str, Any]], namespace: str | None = None) -> None:
    ns = ["-n", namespace] if namespace else []
    for i in range(0, len(docs), 200):
        bed.kubectl(
            "apply",
            *ns,
            "-f",
            "-",
            input_="\n---\n".join(json.dumps(d) for d in docs[i : i + 200]),
            timeout=300,
        )


def fake_allocated_claims(
    namespace: str, count: int, parent: str, pool: str
) -> list[dict[str, Any]]:
    """Claims with an allocation and a reserving pod, written as the scheduler would."""
    claims = []
    for i in range(count):
        claims.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": f"c{i:04d}", "namespace": namespace},
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "net",
                                "exactly": {"deviceClassName": "cni.networking.x-k8s.io"},
                            }
                        ],
                        "config": [
                            {
                                "requests": ["net"],
                                "opaque": {
                                    "driver": DRIVER,
                                    "parameters": {
                                        "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
                                        "kind": "CNIConfig",
                                        "ifName": "net1",
                                        "config": {
                                            "cniVersion": "1.1.0",
                                            "name": "bench",
                                            "plugins": [
                                                {
                                                    "type": "macvlan",
                                                    "master": parent,
                                                    "ipam": cnidra_ipam(pool),
                                                }
                                            ],
                                        },
                                    },
                                },
                            }
                        ],
                    }
                },
            }
        )
    return claims


CLASS_CONFIGS = [
    {"source": "FromClass", "requests": ["net"], "opaque": c["opaque"]}
    for doc in yaml.safe_load_all((ROOT / "deploy" / "deviceclass.yaml").read_text())
    if doc and doc["metadata"]["name"] == "cni.networking.x-k8s.io"  # the class the claims use
    for c in doc["spec"].get("config", [])
]


def allocate(
    bed: Cluster,
    namespace: str,
    names: list[str],
    parent: str,
    pod_uids: dict[str, str] | None = None,
) -> None:
    """Write allocation and reservedFor as the scheduler would (two patches: the apiserver
    drops reservedFor when it comes in the same patch as the allocation). `pod_uids`: claim ->
    the UID of its pod `pod-<claim>` (default: a pod that does not exist)."""
    from lightkube import Client
    from lightkube.config.kubeconfig import KubeConfig
    from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimStatus
    from lightkube.types import PatchType

    client = Client(config=KubeConfig.from_file(bed.env["KUBECONFIG"]))
    for name in names:
        claim = client.get(ResourceClaim, name, namespace=namespace).to_dict()
        opaque = claim["spec"]["devices"]["config"][0]["opaque"]
        allocation = {
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "net", "driver": DRIVER, "pool": NODE, "device": parent}
                        ],
                        # as DRA copies them: the DeviceClass's configs (its CNIPolicy), the claim's
                        "config": [
                            *CLASS_CONFIGS,
                            {"source": "FromClaim", "requests": ["net"], "opaque": opaque},
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
                }
            }
        }
        client.patch(
            ResourceClaimStatus, name, allocation, namespace=namespace, patch_type=PatchType.MERGE
        )
        reserved = {
            "status": {
                "reservedFor": [
                    {
                        "resource": "pods",
                        "name": f"pod-{name}",
                        "uid": (pod_uids or {}).get(name) or str(uuid.uuid4()),
                    }
                ]
            }
        }
        client.patch(
            ResourceClaimStatus, name, reserved, namespace=namespace, patch_type=PatchType.MERGE
        )
    client.close()


def claim_refs(bed: Cluster, namespace: str, names: list[str]) -> list[dra.Claim]:
    """The claims as kubelet names them in NodePrepareResources (namespace, name, UID)."""
    items = json.loads(bed.kubectl("get", "resourceclaims", "-n", namespace, "-o", "json").stdout)[
        "items"
    ]
    refs = {c["metadata"]["name"]: c["metadata"]["uid"] for c in items}
    return [dra.Claim(namespace=namespace, name=n, uid=refs[n]) for n in names]


def time_prepares(stub: Any, calls: list[list[dra.Claim]]) -> list[float]:
    """Each call's NodePrepareResources in milliseconds (every claim prepared without an
    error), each followed by its NodeUnprepareResources (not timed)."""
    times: list[float] = []
    for batch in calls:
        start = time.perf_counter()
        reply = stub.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=batch), timeout=60)
        times.append((time.perf_counter() - start) * 1000)
        errors = [reply.claims[c.uid].error for c in batch if reply.claims[c.uid].error]
        assert not errors, errors[:3]
        stub.NodeUnprepareResources(dra.NodeUnprepareResourcesRequest(claims=batch), timeout=60)
    return times


def prepare_latency(
    bed: Cluster, driver: DriverProcess, namespace: str, names: list[str], rounds: int
) -> dict[str, Any]:
    """Claims reserved for pods that do not exist, so never read ahead: each prepare GETs its
    claims (the fallback path: a claim the pod watch did not see)."""
    claims = claim_refs(bed, namespace, names)
    with grpc.insecure_channel(f"unix://{driver.dra_socket}") as channel:
        stub = dra_grpc.DRAPluginStub(channel)
        time_prepares(stub, [claims[:100]])  # warm-up
        one = time_prepares(stub, [[claims[r % len(claims)]] for r in range(rounds)])
        hundred = time_prepares(stub, [claims[:100]] * max(5, rounds // 3))
        # finally prepare everything, to measure memory with all claims prepared
        for i in range(0, len(claims), 100):
            stub.NodePrepareResources(
                dra.NodePrepareResourcesRequest(claims=claims[i : i + 100]), timeout=120
            )
    return {"prepare_1_claim_ms": summary(one), "prepare_100_claims_ms": summary(hundred)}


def metric(driver: DriverProcess, name: str, labels: str = "") -> float:
    """The sum of a counter's samples whose labels contain `labels` (`result="hit"`)."""
    return sum(
        float(line.split()[-1])
        for line in driver.metrics().splitlines()
        if line.startswith(name) and labels in line
    )


def unscheduled_pod(name: str, claim: str) -> dict[str, Any]:
    """A pod with one claim that no scheduler takes (its `schedulerName` is no scheduler's):
    the bench binds it itself, once its claim is allocated and reserved for it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "cnidra-bench-nobody",
            "automountServiceAccountToken": False,
            "resourceClaims": [{"name": "net", "resourceClaimName": claim}],
            "containers": [
                {
                    "name": "c",
                    "image": tb.TEST_IMAGE,
                    "command": ["sleep", "3600"],
                    "resources": {"claims": [{"name": "net"}]},
                }
            ],
        },
    }


def prepare_ahead(
    bed: Cluster, driver: DriverProcess, parent: str, pools: list[str], rounds: int
) -> dict[str, Any]:
    """NodePrepareResources as a real pod gets it (issue 42: claims read before kubelet asks):
    pods made for no scheduler, their claims allocated and reserved for them, then bound to
    the node through the binding subresource as kube-scheduler binds; the driver's watch of
    the node's pods reads each claim, and each prepare finds its claims read (each used once:
    prepare drops a claim from the cache once used). Kubelet is stopped meanwhile so that it
    does not prepare the pods itself (the driver's gRPC socket is called as kubelet calls it),
    and started again after the pods are gone."""
    ns = namespace(bed)
    # the controller-manager is paused (prepare_and_memory): the namespace's ServiceAccount,
    # which admission wants for a pod, is made here
    bed.kubectl("create", "serviceaccount", "default", "-n", ns, check=False)
    pool = make_pool(bed, pools, AHEAD_SUBNET, [ns])
    batches = max(5, rounds // 12)
    count = rounds + 100 * batches
    claims = fake_allocated_claims(ns, count, parent, pool)
    names = [c["metadata"]["name"] for c in claims]
    apply_many(bed, [*claims, *(unscheduled_pod(f"pod-{n}", n) for n in names)], ns)
    pods = json.loads(bed.kubectl("get", "pods", "-n", ns, "-o", "json").stdout)["items"]
    uids = {p["metadata"]["name"].removeprefix("pod-"): p["metadata"]["uid"] for p in pods}
    allocate(bed, ns, names, parent, uids)
    refs = claim_refs(bed, ns, names)
    kubelet = tb.NODE1.process("kubelet")
    tb.stop(kubelet)
    try:
        reads = metric(driver, "cnidra_claim_lookups_total", 'result="ok"')
        hits = metric(driver, "cnidra_claims_ahead_total", 'result="hit"')
        used = metric(driver, "cnidra_claims_ahead_judgements_total", 'result="used"')
        blocks = {
            when: metric(driver, "cnidra_ipam_blocks_reserved_total", f'when="{when}"')
            for when in ("ahead", "prepare")
        }
        bindings = [
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": f"pod-{n}", "namespace": ns},
                "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
            }
            for n in names
        ]
        bound = time.monotonic()
        bed.kubectl(
            "create",
            "-f",
            "-",
            input_=json.dumps({"apiVersion": "v1", "kind": "List", "items": bindings}),
        )
        bed.wait(
            f"the driver to read the {count} claims ahead",
            lambda: metric(driver, "cnidra_claim_lookups_total", 'result="ok"') >= reads + count,
            120,
        )
        read_in = time.monotonic() - bound
        with grpc.insecure_channel(f"unix://{driver.dra_socket}") as channel:
            stub = dra_grpc.DRAPluginStub(channel)
            one = time_prepares(stub, [[c] for c in refs[:rounds]])
            hundred = time_prepares(
                stub, [refs[rounds + 100 * b : rounds + 100 * (b + 1)] for b in range(batches)]
            )
        hit = metric(driver, "cnidra_claims_ahead_total", 'result="hit"') - hits
        judged = metric(driver, "cnidra_claims_ahead_judgements_total", 'result="used"') - used
        blocks = {
            when: metric(driver, "cnidra_ipam_blocks_reserved_total", f'when="{when}"') - before
            for when, before in blocks.items()
        }
    finally:
        try:  # one DELETE a pod: a few hundred take a minute or more
            bed.kubectl(
                "delete",
                *("pods", "--all", "-n", ns, "--force", "--grace-period=0", "--wait=false"),
                check=False,
                timeout=600,
            )
        finally:
            tb.start_kubelet(bed.bins)
    bed.kubectl("delete", "namespace", ns, "--wait=false")
    return {
        "prepare_1_claim_read_ahead_ms": summary(one),
        "prepare_100_claims_read_ahead_ms": summary(hundred),
        # hits: found read ahead (no GET); judged: of those, the judgement made ahead used
        "read_ahead": {
            "claims": count,
            "hits": hit,
            "judged": judged,
            # the CNIIPBlocks their addresses took: reserved when the pods were bound, or at
            # prepare (a claim that found no free address)
            "blocks_reserved": blocks,
            "all_read_s": round(read_in, 2),
        },
    }


def raw_cni_ms(plugins_dir: str, parent: str, attachments: int, rounds: int) -> dict[str, float]:
    """ADD of macvlan + host-local, the plugin binaries exec'd directly: what a node runs
    without cnidra (cnidra's hook runs macvlan with the static addresses its pool gave at
    prepare). Beside the wall times (`p50`, `p99`: what a pod waits), the ADD's CPU time
    (`cpu_p50`, `cpu_p99`: the plugins' user + system time, macvlan's and the host-local it
    execs, from the children's rusage)."""

    def run(command: str, container: str, pod: str, index: int, data_dir: str) -> None:
        conf = {
            "cniVersion": "1.1.0",
            "name": f"raw{index}",
            "type": "macvlan",
            "master": parent,
            "ipam": {
                "type": "host-local",
                "dataDir": data_dir,
                "ranges": [[{"subnet": f"198.18.{90 + index}.0/24"}]],
            },
        }
        env = {
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": container,
            "CNI_NETNS": pod,
            "CNI_IFNAME": f"net{index + 1}",
            "CNI_PATH": plugins_dir,
            "CNI_ARGS": "",
            "PATH": os.environ["PATH"],
        }
        subprocess.run(
            [f"{plugins_dir}/macvlan"],
            input=json.dumps(conf).encode(),
            env=env,
            capture_output=True,
            check=True,
        )

    def children_cpu() -> float:
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        return used.ru_utime + used.ru_stime

    times, cpu = [], []
    with tempfile.TemporaryDirectory() as tmp, netns.temporary("cnidra-bench-pod") as pod:
        for r in range(rounds):
            start, spent = time.perf_counter(), children_cpu()
            for a in range(attachments):
                run("ADD", f"raw{r}", str(pod), a, tmp)
            times.append((time.perf_counter() - start) * 1000)
            cpu.append((children_cpu() - spent) * 1000)
            for a in range(attachments):
                run("DEL", f"raw{r}", str(pod), a, tmp)
    found = summary(times)
    found.update({f"cpu_{q}": v for q, v in summary(cpu).items() if q in ("p50", "p99")})
    return found


def ready_template(parent: str, attachments: int, pools: list[str]) -> dict[str, Any]:
    """The pods' ResourceClaimTemplate: `attachments` requests of a macvlan on `parent`,
    request n{a} addressed from `pools[a]`."""
    requests = [
        {
            "name": f"n{a}",
            "exactly": {
                "deviceClassName": "cni.networking.x-k8s.io",
                "selectors": [
                    {"cel": {"expression": f'device.attributes["{DRIVER}"].ifName == "{parent}"'}}
                ],
            },
        }
        for a in range(attachments)
    ]
    config = [
        {
            "requests": [f"n{a}"],
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
                    "kind": "CNIConfig",
                    "ifName": f"net{a + 1}",
                    "config": {
                        "cniVersion": "1.1.0",
                        "name": f"ready{a}",
                        "plugins": [
                            {"type": "macvlan", "master": parent, "ipam": cnidra_ipam(pools[a])}
                        ],
                    },
                },
            },
        }
        for a in range(attachments)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "net"},
        "spec": {"spec": {"devices": {"requests": requests, "config": config}}},
    }


def pods_ready(
    bed: Cluster,
    namespace: str,
    parent: str | None,
    count: int,
    attachments: int,
    pools: list[str] | None = None,
    name_prefix: str = "p",
    with_template: bool = True,
) -> dict[str, Any]:
    """`count` pods at once; with a `parent`, a claim each of `attachments` macvlans on it,
    the one of request n{a} addressed from `pools[a]`."""
    docs: list[dict[str, Any]] = []
    claims: list[dict[str, Any]] = []
    if parent:
        claims = [{"name": "net", "resourceClaimTemplateName": "net"}]
    if parent and with_template:
        docs.append(ready_template(parent, attachments, pools or []))
    for i in range(count):
        spec: dict[str, Any] = {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": tb.TEST_IMAGE, "command": ["sleep", "3600"]}],
        }
        if claims:
            spec["resourceClaims"] = claims
            spec["containers"][0]["resources"] = {"claims": [{"name": "net"}]}
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"{name_prefix}{i:03d}"},
                "spec": spec,
            }
        )
    apply_many(bed, docs, namespace)
    deadline = time.monotonic() + 600
    latencies: list[float] = []
    while time.monotonic() < deadline:
        items = [
            p
            for p in json.loads(bed.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)[
                "items"
            ]
            if p["metadata"]["name"].startswith(name_prefix)
        ]
        latencies = []
        for pod in items:
            conds = {c["type"]: c for c in pod["status"].get("conditions", [])}
            if conds.get("Ready", {}).get("status") == "True":
                created = datetime.fromisoformat(
                    pod["metadata"]["creationTimestamp"].replace("Z", "+00:00")
                )
                ready = datetime.fromisoformat(
                    conds["Ready"]["lastTransitionTime"].replace("Z", "+00:00")
                )
                latencies.append((ready - created).total_seconds())
        if len(latencies) == count:
            break
        time.sleep(1)
    if len(latencies) != count:
        raise RuntimeError(f"only {len(latencies)}/{count} pods became Ready")
    return {
        "p50_s": pct(latencies, 0.5),
        "p99_s": pct(latencies, 0.99),
        "max_s": max(latencies),
        "pods": count,
    }


def hook_times(driver: DriverProcess, namespace: str) -> list[float]:
    """The driver logs each attach: 'attached N interface(s) to pod NS/NAME in X ms'."""
    pattern = rf"attached \d+ interface\(s\) to pod {re.escape(namespace)}/\S+ in ([\d.]+) ms"
    return [float(m[1]) for m in re.finditer(pattern, driver.log.read_text(errors="replace"))]


def one_at_a_time(
    bed: Cluster, namespace: str, parent: str, count: int, attachments: int, pools: list[str]
) -> None:
    for i in range(count):
        pods_ready(
            bed,
            namespace,
            parent,
            1,
            attachments,
            pools,
            name_prefix=f"s{i:02d}-",
            with_template=i == 0,
        )


def namespace(bed: Cluster, name: str = "") -> str:
    name = name or f"bench-{uuid.uuid4().hex[:6]}"
    bed.kubectl("create", "namespace", name)
    return name


def make_pool(bed: Cluster, made: list[str], subnet: str, namespaces: list[str]) -> str:
    """A CNIIPPool of `subnet` serving `namespaces`, its name added to `made` (deleted at the
    end, once the driver is stopped)."""
    name = pool_name("driver_latency")
    made.append(name)
    bed.apply(pool_object(name, subnet, namespaces))
    return name


def policy_samples() -> list[dict[str, Any]]:
    """What the run sends, for tests/bench's check against the shipped policy."""
    return [
        pool_object("bench-latency-prepare", PREPARE_SUBNET, ["latency-ns"]),
        *(
            pool_object(f"bench-latency-ready{a}", subnet, ["latency-ns"])
            for a, subnet in enumerate(READY_SUBNETS)
        ),
        *in_namespace(
            "latency-ns",
            *fake_allocated_claims("latency-ns", 1, "bench0", "bench-latency-prepare"),
            ready_template("bench0", 3, [f"bench-latency-ready{a}" for a in range(3)]),
        ),
    ]


def rss(driver: DriverProcess, when: str) -> dict[str, float]:
    """The driver's resident memory (/proc/PID/status), MiB: VmRSS, and its anonymous part
    RssAnon (the heap, what the driver's own work holds) beside the file-backed RssFile (the
    shared libraries' and modules' pages, which the kernel can drop and read again)."""
    fields: dict[str, float] = {}
    for line in Path(f"/proc/{driver.pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "RssAnon", "RssFile"):
            fields[name] = round(int(value.split()[0]) / 1024, 1)
    return {
        f"rss_{when}_mib": fields["VmRSS"],
        f"rss_{when}_anon_mib": fields["RssAnon"],
        f"rss_{when}_file_mib": fields["RssFile"],
    }


def prepare_and_memory(
    bed: Cluster, driver: DriverProcess, parent: str, args: argparse.Namespace, pools: list[str]
) -> dict[str, Any]:
    """The claims are reserved for pods that do not exist; kube-controller-manager would remove
    such reservations, so it is paused while they are measured."""
    out: dict[str, Any] = {}
    ns = namespace(bed)
    pool = make_pool(bed, pools, PREPARE_SUBNET, [ns])
    claims = fake_allocated_claims(ns, args.claims, parent, pool)
    tb.stop("kube-controller-manager")
    try:
        apply_many(bed, claims, ns)
        names = [c["metadata"]["name"] for c in claims]
        allocate(bed, ns, names, parent)
        with profiled(driver, args.profile, "cnidra-prepare"):
            out.update(prepare_ahead(bed, driver, parent, pools, args.rounds))
            out.update(prepare_latency(bed, driver, ns, names, args.rounds))
        out.update(rss(driver, f"{args.claims}_prepared"))
        if args.tracemalloc:
            os.kill(driver.pid, signal.SIGUSR2)  # what grew, written by the driver
        out["claim_gets"] = metric(driver, "cnidra_claim_lookups_total")
    finally:
        tb.start_controllers(bed.bins)
    bed.kubectl("delete", "namespace", ns, "--wait=false")
    return out


def print_results(results: dict[str, Any], as_json: bool) -> None:
    print(json.dumps(results) if as_json else json.dumps(results, indent=2))


def main() -> None:  # noqa: PLR0915 - one linear script of measurements
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--pods", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--claims", type=int, default=1000)
    parser.add_argument("--only", choices=["prepare", "pods"], help="run one half")
    parser.add_argument(
        "--profile", type=Path, help="record a py-spy flame graph (SVG) of prepare here"
    )
    parser.add_argument(
        "--tracemalloc",
        type=Path,
        help="what the driver's memory grew by from idle to the claims prepared, here (text, "
        "by bench/memtrace: the places tracemalloc saw, the mappings, malloc's and pymalloc's "
        "totals, threads, modules, and objects by type; traced, the RSS figures beside it are "
        "larger: --trace-frames 0 leaves them as they are)",
    )
    parser.add_argument(
        "--trace-from",
        choices=["idle", "start"],
        default="idle",
        help="with --tracemalloc: trace allocations from idle on (the default, cheap) or from "
        "the driver's start (every place, slow enough that read-ahead may time out)",
    )
    parser.add_argument(
        "--trace-frames",
        type=int,
        default=2,
        help="with --tracemalloc: frames per place (0: no tracemalloc, "
        "the report's other parts with the driver untraced; 8 was too slow: read-ahead timed out)",
    )
    args = parser.parse_args()
    if args.claims > 8000:
        parser.error(f"--claims: at most 8000 (the addresses of {PREPARE_SUBNET})")
    results: dict[str, Any] = {}
    pools: list[str] = []
    parent = f"bench{uuid.uuid4().hex[:4]}"
    with tb.session() as bins, tempfile.TemporaryDirectory() as tmp:
        bed = Cluster(bins, tb.env_dict())
        bed.install_cnidra_api()  # the CRDs and DeviceClasses, as the chart ships them
        subprocess.run(["ip", "link", "add", parent, "type", "bridge"], check=True)
        subprocess.run(["ip", "link", "set", parent, "up"], check=True)
        traced = (
            {
                "PYTHONPATH": str(ROOT / "bench" / "memtrace"),
                "CNIDRA_BENCH_TRACEMALLOC": str(args.tracemalloc.resolve()),
                "CNIDRA_BENCH_TRACE_FROM": args.trace_from,
                "CNIDRA_BENCH_TRACE_FRAMES": str(args.trace_frames),
            }
            if args.tracemalloc
            else {}
        )
        driver = DriverProcess(
            bed,
            Path(tmp),
            extra_env={"CNIDRA_SUB_INTERFACES": "1000", **traced},  # pods share one parent
        )
        try:
            driver.start()
            bed.wait("the NRI plugin to connect", lambda: driver.health().get("nriConnected"), 30)
            time.sleep(2)
            results.update(rss(driver, "idle"))
            if args.tracemalloc:
                os.kill(driver.pid, signal.SIGUSR2)  # the baseline
            if args.only != "pods":
                results.update(prepare_and_memory(bed, driver, parent, args, pools))
            if args.only == "prepare":
                return print_results(results, args.json)
            # the pods' namespaces, named first: the attachments' pools serve them
            with_one, seq_one, seq_three = (f"bench-{uuid.uuid4().hex[:6]}" for _ in range(3))
            ready = [
                make_pool(bed, pools, subnet, [with_one, seq_one, seq_three])
                for subnet in READY_SUBNETS
            ]
            without = namespace(bed)
            results["pod_ready_without_attachment"] = pods_ready(bed, without, None, args.pods, 0)
            bed.kubectl("delete", "namespace", without, "--wait=false")
            namespace(bed, with_one)
            results["pod_ready_with_1_attachment"] = pods_ready(
                bed, with_one, parent, args.pods, 1, ready
            )
            results["hook_1_attachment_during_burst_ms"] = summary(hook_times(driver, with_one))
            bed.kubectl("delete", "namespace", with_one, "--wait=false")
            namespace(bed, seq_one)
            one_at_a_time(bed, seq_one, parent, 20, 1, ready)
            results["hook_1_attachment_ms"] = summary(hook_times(driver, seq_one))
            namespace(bed, seq_three)
            one_at_a_time(bed, seq_three, parent, 20, 3, ready)
            results["hook_3_attachments_ms"] = summary(hook_times(driver, seq_three))
            for ns_ in (seq_one, seq_three):
                bed.kubectl("delete", "namespace", ns_, "--wait=false")
            plugins = str(bed.bins.cni_plugins)
            with netns.temporary("cnidra-bench-node") as node:
                subprocess.run(
                    [
                        "ip",
                        "-n",
                        node.name,
                        "link",
                        "add",
                        "data0",
                        "type",
                        "veth",
                        "peer",
                        "name",
                        "data0p",
                    ],
                    check=True,
                )
                subprocess.run(["ip", "-n", node.name, "link", "set", "data0", "up"], check=True)
                with netns.entered(node):
                    results["raw_cni_1_attachment_ms"] = raw_cni_ms(
                        plugins, "data0", 1, args.rounds
                    )
                    results["raw_cni_3_attachments_ms"] = raw_cni_ms(
                        plugins, "data0", 3, args.rounds
                    )
        finally:
            driver.stop()
            for pool in pools:
                delete_pool(bed, pool)
            subprocess.run(["ip", "link", "del", parent], check=False, capture_output=True)
    print_results(results, args.json)


if __name__ == "__main__":
    main()
