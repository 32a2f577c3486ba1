"""Issue 44, "unreserved pods cannot crowd reserved ones", measured with TCP in namespaces of
the test's own: two "pods" and a sink on one bridge (the shared link, taken as 30 Mbit/s),
pod r reserved 20M and pod u nothing under the default `whenUnreserved: Leftover`. The
keeper (cnidra.nri.bandwidth, with the real cnidra.datapath.shaping) holds r to 20M and u to
what r leaves, 10M; pushing at once, each gets its own, in both directions, and together no
more than the link. When r's interface goes, the keeper gives u the whole link; when the
class then holds unreserved claims to 5M, u follows it while it runs.

A second test: a reserved pod that may burst borrows only its share of what the grants leave.

The rates are a tenth of a real link's: what the shaper holds, not what the machine can push,
must set each rate, and a loaded CI machine (make test's unit half beside the test bed's on 2
cores) pushed a single TCP flow at only 261 Mbit/s into a 300M limit (a 2-core machine alone
pushes the shaping tests' 80M with room to spare).

Only the test's namespaces and links, 198.18.45.0/24. Each measurement is 2 s; the file takes
about 20 s."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cnidra.api.bandwidth import DEFAULT_RULES, BandwidthRules, Rate, Terms
from cnidra.api.constants import API_VERSION, DRIVER_NAME
from cnidra.api.refs import ObjectRef
from cnidra.cni import netns
from cnidra.cni.attach import Attachment
from cnidra.datapath import shaping
from cnidra.nri.bandwidth import BandwidthKeeper
from cnidra.state.layout import StateLayout
from cnidra.state.sandboxes import Attached, SandboxRecord, SandboxStore, State
from cnidra.util.locks import KeyedLocks
from tests.datapath.traffic import PAYLOAD_SHARE, PORT, Transfer, ip, send, wait_for_carrier
from tests.nri.fakes import RecordingStatus

pytestmark = pytest.mark.netns

M = 10**6
LINK = 30 * M  # the bridge's speed as the node would publish it
RESERVED = 20 * M
SECONDS = 2.0
SINK_IP = "198.18.45.100"
PODS = {"r": "198.18.45.1", "u": "198.18.45.2"}
IF_NAME = "net1"


@dataclass(frozen=True)
class Link:
    pods: dict[str, Path]
    sink: Path


@pytest.fixture
def link() -> Iterator[Link]:
    with contextlib.ExitStack() as stack:
        switch = stack.enter_context(netns.temporary("cnidra-lo-sw"))
        sink = stack.enter_context(netns.temporary("cnidra-lo-sink"))
        pods = {name: stack.enter_context(netns.temporary(f"cnidra-lo-{name}")) for name in PODS}
        ip(switch, "link", "add", "br0", "type", "bridge")
        ip(switch, "link", "set", "br0", "up")
        ends = []
        for name, ns, address, inside in (
            *((n, pods[n], a, IF_NAME) for n, a in PODS.items()),
            ("sink", sink, SINK_IP, "eth0"),
        ):
            port = f"p-{name}"
            peer = ("peer", "name", inside, "netns", ns.name)
            ip(switch, "link", "add", port, "type", "veth", *peer)
            ip(switch, "link", "set", port, "master", "br0", "up")
            ip(ns, "addr", "add", f"{address}/24", "dev", inside)
            ip(ns, "link", "set", inside, "up")
            ends += [(switch, port), (ns, inside)]
        wait_for_carrier(*ends)
        yield Link(pods, sink)


def record(
    name: str, ns: Path, granted: int | None, rules: BandwidthRules = DEFAULT_RULES
) -> SandboxRecord:
    """What the hook leaves once the pod's interface is up: its claim's terms on the bridge."""
    ref = ObjectRef("ns", name, f"{name}-uid")
    att = Attachment(
        ref,
        "req0",
        IF_NAME,
        {"cniVersion": "1.1.0", "name": name, "plugins": [{"type": "macvlan"}]},
        "node",
        "br0",
        parent="br0",
        bandwidth=Terms(granted, LINK, rules, "cni.networking.x-k8s.io"),
    )
    result = {"cniVersion": "1.1.0", "interfaces": [{"name": IF_NAME, "sandbox": str(ns)}]}
    pod = ObjectRef("ns", name, f"{name}-pod")
    return SandboxRecord(f"{name}-sandbox", pod, str(ns), State.ADDED, (Attached(att, result),))


def at_once(flows: dict[str, tuple[Path, Path, str]]) -> dict[str, Transfer]:
    """One TCP flow per entry (src, dst, dst ip), all at the same time."""
    got: dict[str, Transfer] = {}

    def run(name: str, port: int) -> None:
        src, dst, address = flows[name]
        got[name] = send(src, dst, address, SECONDS, port=port)

    threads = [
        threading.Thread(target=run, args=(name, PORT + 10 + i)) for i, name in enumerate(flows)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return got


def within(measured_mbps: float, limit_bps: int, share: float = 0.10) -> bool:
    """The payload rate within `share` of what the limit lets through as payload."""
    expected = limit_bps / M * PAYLOAD_SHARE
    return abs(measured_mbps - expected) <= share * expected


async def test_an_unreserved_pod_takes_only_what_the_reservation_leaves(
    link: Link, tmp_path: Path
) -> None:
    store = SandboxStore(StateLayout(tmp_path))
    keeper = BandwidthKeeper(store, RecordingStatus(), KeyedLocks())  # the real shaper
    keeper.replace_classes([])  # the DeviceClass LIST: none yet
    await store.put(record("r", link.pods["r"], RESERVED))
    await store.put(record("u", link.pods["u"], None))
    assert await keeper.reconcile() == 2
    share = LINK - RESERVED
    for name, limit in (("r", RESERVED), ("u", share)):
        shaped = shaping.read(link.pods[name], IF_NAME)
        assert shaped.egress is not None and shaped.ingress is not None
        assert shaped.egress.limit == shaped.ingress.limit == Rate(limit, limit)

    out = at_once({n: (link.pods[n], link.sink, SINK_IP) for n in PODS})
    into = at_once({n: (link.sink, link.pods[n], a) for n, a in PODS.items()})
    print(
        f"\nr reserved 20M, u nothing, at once on a 30M link: "
        f"out r {out['r'].mbps:.1f} u {out['u'].mbps:.1f}; "
        f"into r {into['r'].mbps:.1f} u {into['u'].mbps:.1f} Mbit/s"
    )
    for way, measured in (("out of", out), ("into", into)):
        assert within(measured["r"].mbps, RESERVED), f"r {way} its pod: {measured}"
        assert within(measured["u"].mbps, share), f"u {way} its pod: {measured}"
        assert measured["r"].mbps + measured["u"].mbps <= LINK / M, measured

    # r's interface goes (its pod deleted): u gets the whole link
    await store.remove("r-sandbox")
    assert await keeper.reconcile() == 1
    alone = at_once({"u": (link.pods["u"], link.sink, SINK_IP)})
    print(f"u alone: out {alone['u'].mbps:.1f} Mbit/s")
    assert within(alone["u"].mbps, LINK), alone
    egress = shaping.read(link.pods["u"], IF_NAME).egress
    assert egress is not None and egress.limit == Rate(LINK, LINK)

    # the admin's class now holds unreserved claims to 5M: the running pod follows it live
    keeper.class_changed(
        "MODIFIED",
        {
            "metadata": {"name": "cni.networking.x-k8s.io"},
            "spec": {
                "config": [
                    {
                        "opaque": {
                            "driver": DRIVER_NAME,
                            "parameters": {
                                "apiVersion": API_VERSION,
                                "kind": "CNIPolicy",
                                "bandwidth": {"whenUnreserved": "5M"},
                            },
                        }
                    }
                ]
            },
        },
    )
    assert await keeper.reconcile() == 1
    slow = at_once({"u": (link.pods["u"], link.sink, SINK_IP)})
    print(f"u after its class said 5M: out {slow['u'].mbps:.1f} Mbit/s")
    assert within(slow["u"].mbps, 5 * M), slow


async def test_a_reserved_pod_that_may_burst_borrows_only_its_share_of_the_rest(
    link: Link, tmp_path: Path
) -> None:
    """r reserved 10M and may burst, u reserved nothing, on the 30M link: the 20M r's grant
    leaves is shared by the two, so r alone bursts to 20M (not the link's 30M), and at once
    they take no more than the link."""
    store = SandboxStore(StateLayout(tmp_path))
    keeper = BandwidthKeeper(store, RecordingStatus(), KeyedLocks())
    keeper.replace_classes([])
    bursting = BandwidthRules.model_validate({"burst": "Allowed"})
    await store.put(record("r", link.pods["r"], 10 * M, bursting))
    await store.put(record("u", link.pods["u"], None))
    assert await keeper.reconcile() == 2
    egress = shaping.read(link.pods["r"], IF_NAME).egress
    assert egress is not None and egress.limit == Rate(10 * M, 20 * M)
    alone = at_once({"r": (link.pods["r"], link.sink, SINK_IP)})
    both = at_once({n: (link.pods[n], link.sink, SINK_IP) for n in PODS})
    print(
        f"\nr reserved 10M and may burst, u nothing, on a 30M link: r alone "
        f"{alone['r'].mbps:.1f}; at once r {both['r'].mbps:.1f} u {both['u'].mbps:.1f} Mbit/s"
    )
    assert within(alone["r"].mbps, 20 * M), alone
    assert both["r"].mbps >= 0.9 * 10 and within(both["u"].mbps, 10 * M), both
    assert both["r"].mbps + both["u"].mbps <= LINK / M, both
