"""Issue 44, "measured, not assumed", on the test bed: with the driver run as deploy/ ships it
(the chart's classes and defaults), three pods take macvlan interfaces on ONE parent link
through claims of the default class: `a` reserves 100M of the link's `bandwidth` capacity, `b`
400M, `c` nothing. The scheduler grants the reservations (the allocation's
`consumedCapacity.bandwidth`), the driver holds each interface to its grant in both
directions (an HTB and an IFB of the pod's own, read back from the pod's namespace, and the
claim's `BandwidthLimited` condition), and real TCP proves it: a and b push at once, out of
their pods and then into them, and each gets its reservation within 10 %. c gets what the
class says of a claim that reserved nothing (the shipped class: `whenUnreserved` Leftover, the
default, so what a and b leave of the link's 10 Gbit/s, 9.5 Gbit/s, which the driver keeps
current as the pods come up, and TCP well above any reservation yet below that share; a class
with a rate would be held to it, one with Unlimited to nothing). A claim's grant cannot change
(the apiserver refuses a patch of a's allocation as immutable); the admin's class can: changed
while the pods run (unreserved claims held to 200M), c follows, a and b keep their grants, and
the class is put back.

The parent is a host-only bridge (the `test_link` fixture) with one port, a veth whose other
end sits in a namespace of the test's own, the sink: the pods' peer for every flow, never
shaped itself. The veth also gives the bridge a speed (a bridge reports its fastest port's,
a veth 10000 Mb/s), without which the driver publishes no `bandwidth` capacity for it. The
flows are a Python sender and receiver of this process (tests/datapath/traffic.py): their
sockets are made inside the pods' and the sink's namespaces (the pods' found with crictl
inspectp), each flow stops by itself after SECONDS, and its rate is the bytes the receiver got
over the steady part (the first 0.5 s, TCP's slow start, left out). The rate is the TCP
payload's, which is the limit less the headers the shaper counts (Ethernet, IP and TCP: 66
bytes of each 1514-byte frame, 4.4 %); "within 10 %" is of that payload rate. The machine's
CPU over each measurement is reported beside it (a failure says what bounded it).

Only the test's own links (the bridge, the veth) and 198.19.44.0/24 (inside 198.18.0.0/15);
`pytest -s` prints the figures (the README's)."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from cnidra.api.bandwidth import (
    BURST_DENIED,
    DEFAULT_RULES,
    BandwidthRules,
    format_rate,
    leftover_share,
    parse_quantity,
)
from cnidra.api.constants import CONDITION_BANDWIDTH
from cnidra.cni import netns
from cnidra.datapath import shaping
from testbed.harness import Cluster, DriverProcess
from tests.datapath.traffic import PORT, Transfer, send
from tests.testbed.conftest import slice_devices
from tests.testbed.objects import DRIVER, apply, claiming_pod, cni_config, ready, template

# last in the test bed's half: its rates assume a CPU the unit half beside it no longer takes
pytestmark = [pytest.mark.testbed, pytest.mark.quiet]

M = 1_000_000
SUBNET = "198.19.44.0/24"
RANGE_END = "198.19.44.199"  # the pods' addresses; the sink's is above them
SINK_IP = "198.19.44.254"
SINK_IF = "sink0"
IF_NAME = "net1"
DEFAULT_CLASS = "cni.networking.x-k8s.io"
# what each pod's claim reserves (None: nothing)
RESERVED: dict[str, int | None] = {"a": 100 * M, "b": 400 * M, "c": None}
SECONDS = 3.0  # each measurement; its first 0.5 s is slow start and left out
SHARE = 0.10
# an unlimited pod is held to nothing of cnidra's: it goes well past every reservation here
UNLIMITED_FLOOR_MBPS = 1000.0


@dataclass(frozen=True)
class Sink:
    """The pods' peer: a namespace of the test's own on the parent bridge (through a veth)."""

    parent: str
    netns: Path


@pytest.fixture
def sink(test_link: Callable[[str], str]) -> Iterator[Sink]:
    """A host-only bridge with one port: a veth to the sink namespace (198.19.44.254)."""
    parent = test_link(f"tb{uuid.uuid4().hex[:6]}")
    port = f"{parent}s"
    with netns.temporary("cnidra-bw-sink") as ns:
        host = ["ip", "link"]
        subprocess.run(
            [*host, "add", port, "type", "veth", "peer", "name", SINK_IF, "netns", ns.name],
            check=True,
        )
        try:
            subprocess.run([*host, "set", "dev", port, "master", parent], check=True)
            subprocess.run([*host, "set", "dev", port, "up"], check=True)
            inside = ["ip", "-n", ns.name]
            subprocess.run([*inside, "addr", "add", f"{SINK_IP}/24", "dev", SINK_IF], check=True)
            subprocess.run([*inside, "link", "set", "dev", SINK_IF, "up"], check=True)
            yield Sink(parent, ns)
        finally:
            subprocess.run([*host, "del", port], check=False, capture_output=True)


def reserving(name: str, parent: str, pool: str, bandwidth: int | None) -> dict[str, Any]:
    """A template of one macvlan network (net1) on `parent`, reserving `bandwidth` bit/s of
    its `bandwidth` capacity (None: no request; the capacity's default, 0)."""
    made = template(name, [(name, parent, cni_config(name, parent, pool), IF_NAME)])
    if bandwidth is not None:
        [request] = made["spec"]["spec"]["devices"]["requests"]
        request["exactly"]["capacity"] = {"requests": {"bandwidth": format_rate(bandwidth)}}
    return made


def class_rules(cluster: Cluster) -> BandwidthRules:
    """The `bandwidth` rules of the default class's CNIPolicy, as installed."""
    klass = cluster.get("deviceclass", DEFAULT_CLASS, namespace=None)
    [policy] = [
        c["opaque"]["parameters"]
        for c in klass["spec"].get("config", [])
        if c["opaque"]["driver"] == DRIVER and c["opaque"]["parameters"]["kind"] == "CNIPolicy"
    ]
    rules = policy.get("bandwidth")
    return DEFAULT_RULES if rules is None else BandwidthRules.model_validate(rules)


def sandbox_netns(cluster: Cluster, namespace: str, pod: str) -> Path:
    """The network namespace of the pod's ready sandbox, as the runtime reports it."""
    sandboxes = json.loads(cluster.crictl("pods", "--namespace", namespace, "-o", "json").stdout)
    [sandbox] = [
        s
        for s in sandboxes["items"]
        if s["metadata"]["name"] == pod and s["state"] == "SANDBOX_READY"
    ]
    info = json.loads(cluster.crictl("inspectp", sandbox["id"]).stdout)
    [path] = [
        n["path"]
        for n in info["info"]["runtimeSpec"]["linux"]["namespaces"]
        if n["type"] == "network"
    ]
    return Path(path)


def pod_claim(cluster: Cluster, namespace: str, pod: str) -> dict[str, Any]:
    status = cluster.get("pod", pod, namespace)["status"]
    [name] = [s["resourceClaimName"] for s in status["resourceClaimStatuses"]]
    return cluster.get("resourceclaim", name, namespace)


def expected(rules: BandwidthRules, reserved: int | None) -> int | None:
    """What a pod's interface is held to with all three up: its grant, else what the class
    says of a claim that reserved nothing (Leftover: what a and b leave of the 10G link)."""
    if reserved is not None:
        return reserved
    if rules.shares_leftover:
        taken = sum(r for r in RESERVED.values() if r is not None)
        sharers = sum(1 for r in RESERVED.values() if r is None)
        return leftover_share(10_000 * M, taken, sharers)
    return rules.floor_bps


def saying(cluster: Cluster, namespace: str, pod: str, said: list[str]) -> dict[str, Any] | None:
    """The pod's claim's entry once written Ready with `said` as its BandwidthLimited message
    (none: no such condition), else None."""
    entry = written(cluster, namespace, pod)
    if entry is None:
        return None
    messages = [c["message"] for c in entry["conditions"] if c["type"] == CONDITION_BANDWIDTH]
    return entry if messages == said else None


def written(cluster: Cluster, namespace: str, pod: str) -> dict[str, Any] | None:
    """The status.devices entry of the pod's claim once the driver wrote it Ready, else None."""
    claim = pod_claim(cluster, namespace, pod)
    for entry in claim.get("status", {}).get("devices", []):
        if any(c["type"] == "Ready" and c["status"] == "True" for c in entry["conditions"]):
            return dict(entry)
    return None


def machine_cpu_seconds() -> float:
    """CPU seconds the whole machine spent, all CPUs: user, nice, system, irq, softirq."""
    with open("/proc/stat") as stat:
        user, nice, system, _idle, _iowait, irq, softirq = (
            int(f) for f in stat.readline().split()[1:8]
        )
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Measured:
    """Flows that ran at once: each one's payload rate, and the machine's CPU meanwhile."""

    mbps: dict[str, float]
    cores_busy: float  # CPU seconds a second, all CPUs together (2.0: both of this machine's)
    wall_s: float

    def __str__(self) -> str:
        rates = ", ".join(f"{k} {v:,.1f} Mbit/s" for k, v in self.mbps.items())
        return f"{rates} (machine CPU: {self.cores_busy:.2f} of {os.cpu_count()} cores busy)"


def at_once(flows: dict[str, tuple[Path, Path, str]]) -> Measured:
    """`flows` (name -> source namespace, receiving namespace, receiver's address) all at once
    for SECONDS, each on a port of its own; each stops by itself."""
    began, cpu = os.times().elapsed, machine_cpu_seconds()
    with ThreadPoolExecutor(len(flows), thread_name_prefix="flow") as pool:
        running = {
            name: pool.submit(send, src, dst, address, SECONDS, port=PORT + i)
            for i, (name, (src, dst, address)) in enumerate(flows.items())
        }
        done: dict[str, Transfer] = {
            name: future.result(timeout=SECONDS + 30) for name, future in running.items()
        }
    wall = os.times().elapsed - began
    busy = (machine_cpu_seconds() - cpu) / wall
    return Measured({name: t.mbps for name, t in done.items()}, busy, wall)


def within(measured: float, limit_bps: int) -> bool:
    return abs(measured * M - limit_bps) <= SHARE * limit_bps


def test_two_pods_on_one_parent_each_get_their_reservation_at_once_in_both_directions(
    cluster: Cluster,
    namespace: str,
    sink: Sink,
    ip_pools: Callable[..., str],
    start_driver: Callable[..., DriverProcess],
) -> None:
    rules = class_rules(cluster)
    # the reserved pods are held to their grant exactly when the class allows no bursts (the
    # chart's default); a class that allows them would let a pod borrow up to its ceiling
    assert rules.burst == BURST_DENIED, f"the shipped class allows bursts: {rules}"
    pool = ip_pools(SUBNET, namespace, rangeEnd=RANGE_END)
    start_driver()
    speed = cluster.wait(
        "the parent's bandwidth in the slice",
        lambda: (
            slice_devices(cluster)
            .get(sink.parent, {})
            .get("capacity", {})
            .get("bandwidth", {})
            .get("value")
        ),
        30,
    )
    # the veth's speed, as the bridge reports it (the apiserver writes 10000M as 10G)
    assert parse_quantity(speed) == 10_000 * M
    for pod, reserved in RESERVED.items():
        apply(
            cluster,
            namespace,
            reserving(f"bw-{pod}", sink.parent, pool, reserved),
            claiming_pod(pod, f"bw-{pod}"),
        )
    for pod in RESERVED:
        ready(cluster, namespace, pod)

    # what the scheduler granted and the driver says it enforces, and what the pod's
    # namespace holds
    netnses: dict[str, Path] = {}
    addresses: dict[str, str] = {}
    for pod, reserved in RESERVED.items():
        claim = pod_claim(cluster, namespace, pod)
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert result["device"] == sink.parent, result
        # the grant; a claim that reserved nothing is granted the capacity's default, 0 (or
        # no entry)
        granted = result.get("consumedCapacity", {}).get("bandwidth")
        if reserved is None:
            assert granted is None or parse_quantity(granted) == 0, result
        else:
            assert parse_quantity(granted) == reserved, result
        held = expected(rules, reserved)
        said = (
            []
            if held is None
            else [f"{IF_NAME} is held to {format_rate(held)}bit/s in each direction"]
        )
        # (a share changes as the other pods come up: the driver's keeper follows, shortly)
        entry = cluster.wait(
            f"{pod}'s claim status to say {said}",
            partial(saying, cluster, namespace, pod, said),
            30,
        )
        [addresses[pod]] = [ip.partition("/")[0] for ip in entry["networkData"]["ips"]]
        netnses[pod] = sandbox_netns(cluster, namespace, pod)
        tc = shaping.read(netnses[pod], IF_NAME)
        if held is None:
            assert (tc.egress, tc.ingress) == (None, None), tc
        else:
            assert tc.egress is not None and tc.ingress is not None, tc
            for direction in (tc.egress, tc.ingress):
                assert (direction.rate, direction.ceil) == (held, held), tc

    # a and b at once: out of their pods to the sink, then from the sink into them
    out = at_once({pod: (netnses[pod], sink.netns, SINK_IP) for pod in ("a", "b")})
    into = at_once({pod: (sink.netns, netnses[pod], addresses[pod]) for pod in ("a", "b")})
    # c alone, each way: what the class gives a claim that reserved nothing
    c_out = at_once({"c": (netnses["c"], sink.netns, SINK_IP)})
    c_into = at_once({"c": (sink.netns, netnses["c"], addresses["c"])})
    print(
        f"\nreserved, at once, {SECONDS:g} s each: out of the pods {out}; into them {into}"
        f"\nunreserved (class: {rules.when_unreserved}), alone: out {c_out}; into {c_into}"
    )
    for way, measured in (("out of", out), ("into", into)):
        for pod in ("a", "b"):
            reserved = RESERVED[pod]
            assert reserved is not None
            assert within(measured.mbps[pod], reserved), (
                f"{pod} reserved {format_rate(reserved)}bit/s and got "
                f"{measured.mbps[pod]:.1f} Mbit/s {way} its pod beside the other: {measured}"
            )
    floor = expected(rules, None)
    for way, measured in (("out of", c_out), ("into", c_into)):
        got = measured.mbps["c"]
        if floor is not None and rules.shares_leftover:  # CPU-bound below its share here
            assert UNLIMITED_FLOOR_MBPS < got <= floor / M, (
                f"c reserved nothing, the class shares what a and b leave, "
                f"{format_rate(floor)}bit/s, and it got {got:.1f} Mbit/s {way} its pod: {measured}"
            )
        elif floor is None:
            assert got > UNLIMITED_FLOOR_MBPS, (
                f"c reserved nothing, the class says {rules.when_unreserved}, and it got "
                f"{got:.1f} Mbit/s {way} its pod: {measured}"
            )
        else:
            assert within(got, floor), f"c is held to {format_rate(floor)}: {measured}"
    # the shapers carried the flows and held them back (their counters, read back)
    for pod in ("a", "b"):
        tc = shaping.read(netnses[pod], IF_NAME)
        assert tc.egress is not None and tc.ingress is not None
        for direction in (tc.egress, tc.ingress):
            assert direction.overlimits > 0 and direction.sent_bytes > 0, tc

    grant_cannot_change(cluster, namespace)
    class_change_is_followed(cluster, namespace, netnses)


def grant_cannot_change(cluster: Cluster, namespace: str) -> None:
    """Kubernetes 1.37 refuses a change to a claim's allocation once set (so its grant is what
    the pod keeps; docs/configuration.md, "While the pod runs"): a's grant, raised by a
    patch of the status subresource, is refused ("field cannot be modified once set")."""
    name = pod_claim(cluster, namespace, "a")["metadata"]["name"]
    path = "/status/allocation/devices/results/0/consumedCapacity/bandwidth"
    refused = cluster.kubectl(
        "patch", "resourceclaim", name, "-n", namespace, "--subresource=status",
        "--type=json", "-p", json.dumps([{"op": "replace", "path": path, "value": "900M"}]),
        check=False,
    )  # fmt: skip
    assert refused.returncode != 0, refused.stdout
    said = "status.allocation: Invalid value: null: field cannot be modified once set"
    assert said in refused.stderr, refused.stderr
    [result] = pod_claim(cluster, namespace, "a")["status"]["allocation"]["devices"]["results"]
    assert parse_quantity(result["consumedCapacity"]["bandwidth"]) == RESERVED["a"]


def class_change_is_followed(cluster: Cluster, namespace: str, netnses: dict[str, Path]) -> None:
    """The admin changes the class while the pods run: its claims that reserved nothing are
    now held to 200M; the driver follows (a claim's grant itself cannot change: a and b keep
    theirs). The class is put back as it was."""
    klass = cluster.get("deviceclass", DEFAULT_CLASS, namespace=None)
    changed = json.loads(json.dumps(klass))
    for config in changed["spec"]["config"]:
        parameters = config["opaque"]["parameters"]
        if config["opaque"]["driver"] == DRIVER and parameters["kind"] == "CNIPolicy":
            rules = parameters.get("bandwidth") or {}
            parameters["bandwidth"] = {**rules, "whenUnreserved": "200M"}
    cluster.kubectl("replace", "-f", "-", input_=json.dumps(changed))
    try:
        said = [f"{IF_NAME} is held to 200Mbit/s in each direction"]
        cluster.wait("c's claim to say 200M", partial(saying, cluster, namespace, "c", said), 30)
        tc = shaping.read(netnses["c"], IF_NAME)
        assert tc.egress is not None and tc.ingress is not None, tc
        for direction in (tc.egress, tc.ingress):
            assert (direction.rate, direction.ceil) == (200 * M, 200 * M), tc
        for pod in ("a", "b"):  # the grants hold
            tc = shaping.read(netnses[pod], IF_NAME)
            assert tc.egress is not None and tc.egress.rate == RESERVED[pod], tc
    finally:
        restored = cluster.get("deviceclass", DEFAULT_CLASS, namespace=None)
        restored["spec"] = klass["spec"]
        cluster.kubectl("replace", "-f", "-", input_=json.dumps(restored))
