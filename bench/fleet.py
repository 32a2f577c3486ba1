"""A fleet of fake nodes on a control plane of its own: what cnidra's ResourceSlices cost the
apiserver, etcd and the scheduler at N nodes, beside the same fleet published as
dra-example-driver publishes its GPUs, and what each node's driver asks of the apiserver at rest
(not a test: numbers; issue 28).

    python -m bench.fleet [--nodes 1000] [--pods 100] [--rate 10] [--rounds 2]
                          [--sample 50] [--idle-seconds 300] [--ahead-pods 100]
                          [--ahead-elsewhere 3] [--timeout 3600] [--json]

The test bed is a singleton (and may be busy), so this starts its own etcd, kube-apiserver
(resource.k8s.io/v1 and the test bed's DRA feature gates) and kube-scheduler from the test bed's
cached binaries (testbed/build.sh), on free loopback ports, with certificates and data under a
temporary directory, all removed at the end. No kubelet and no controller-manager: Nodes are
objects created Ready, claims are made directly (pods reference them by name), so nothing
else writes.

1. N Nodes (labels kubernetes.io/hostname, an InternalIP), concurrently; each holds one block
   of a cnidra IPAM pool (CNIIPBlock, made by the driver's own KubeIPAM).
2. cnidra's slices for each node, written by the driver's own SlicePublisher (server-side
   apply) from a synthetic inventory: the node's primary NIC and loopback (never published),
   2 to 6 data links besides two ConnectX ports (4-8 devices: PCI NICs with SR-IOV, a bond,
   VLANs, a bridge), pods' veths and a CNI bridge (filtered), three named networks (CNINetworks:
   one with a cnidra IPAM pool, one only where its parent exists), the reference plugins
   installed. Sizes as etcd stores them (protobuf) and as a JSON client reads them.
3. At rest: --sample nodes run the driver's apiserver-facing background work as `cnidra driver`
   wires it (the cluster feature probe; the publisher with its resync, CNINetwork watch and
   pool counts; the IPAM reconciler; the claims read ahead on the node-scoped pod watch),
   each with the driver's own client, started spread over one resync period as a fleet's
   drivers are; every request is counted by an httpx event hook on both of the client's
   connections (the requests' and the watches'), from 20 s after the last one started, for
   --idle-seconds. The synthetic links never change, so the publisher's netlink monitor is
   left out (this machine's link events, from the test bed's pods, are no fake node's).
3b. Claims read ahead (issue 42; --ahead-pods 0 leaves it out): before step 3, --ahead-pods
   pods are bound to the last node (spec.nodeName), each with a claim allocated on that node
   and reserved for it as the scheduler leaves them, and --ahead-elsewhere pods with a claim
   of their own are bound to every other node; beside step 3, bench.claims_ahead runs that
   node's read-ahead as the driver wires it in a process of its own: its VmRSS and RssAnon
   before and after the claims were read and after --idle-seconds at rest, the bytes its
   tables hold, and its requests at start and a minute at rest. The pods and claims are
   deleted before step 4.
4. Scheduling: --pods pods, each pinned to a random node by nodeSelector with a claim of one
   device (cnidra: a link by CEL, ifName and cniMacvlan, one sub-interface), created at --rate
   a second; the time from each pod's create to its claim allocated and to its nodeName (watch
   events, client clock), and the scheduler's own histograms over the round (a scheduling
   cycle, the DRA plugin at each extension point, PreBind). Then cnidra's slices are deleted
   and the fleet publishes dra-example-driver's shape instead (one pool of 8 GPUs a node:
   index, uuid, model, driverVersion, memory capacity), and as many pods are scheduled again.
   --rounds repeats both, alternating which goes first; --warmup-pods before each round are
   not counted. The machine's load average is recorded with each round.

5. `--pool-accounting` [--pools 100]: only what pool accounting costs (the pool accountant's
   memory, one flush, the apiserver requests at rest and per allocation, the Lease), measured
   in-process on a counting fake cluster (bench/fleet_pools.py; seconds, no control plane).
   The sample nodes of the full run also run each node's block writer and the Lease loop, so
   step 3's figures include them. With `--control-plane`, the same against this fleet's own
   etcd and kube-apiserver: every node's block writer and one accountant, as the driver runs
   them, their requests counted and the apiserver's CPU read (bench/fleet_pools_apiserver.py;
   about 2 minutes at 1,000 nodes and 100 pools).

Prints a report on stderr; with --json the detail as one JSON line, then the last line:
{"nodes", "slices", "slice_bytes_per_node", "idle_requests_per_node_per_min",
"schedule_p50_ms", "schedule_p99_ms", "dra_example_schedule_p99_ms", "apiserver_rss_mib",
"claims_ahead_vmrss_mib", "claims_ahead_added_rssanon_mib", "claims_ahead_requests_per_min"}:
cnidra's slices and the bytes of a node's in etcd (protobuf), the sample's requests a node a
minute at rest, pod create to claim allocated for cnidra and dra-example, the apiserver's
RSS with cnidra's fleet published and the sample running, and the claims-ahead driver's
VmRSS at rest, the RssAnon its read-ahead added and its requests a minute at rest. A figure
not measured is null.
Takes about 8 minutes at 50 or 1,000 nodes on a quiet 2-core machine (--rounds 4: 9 and 10; 13
at 1,000 beside a busy test bed); the claims ahead add about 1 minute at 1,000 nodes (9.2 in
all, 2026-11-27). --memory instead: each fleet's apiserver memory alone on a
fresh control plane (4 minutes at 1,000 nodes). Figures and what they mean: docs/performance.md."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import dataclasses
import ipaddress
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx2
import yaml

from cnidra.agent.settings import DriverSettings
from cnidra.api.constants import API_VERSION, DRIVER_NAME
from cnidra.api.ipam import LABEL_POOL, pool_from_object
from cnidra.api.networks import NamedNetwork
from cnidra.dra.ahead import ClaimsAhead, ReadAhead
from cnidra.inventory.links import Link, LinkFilter
from cnidra.inventory.publisher import SlicePublisher
from cnidra.inventory.slices import SliceSettings
from cnidra.ipam.accounting import (
    LEASE_SECONDS,
    BlockLeaseWriter,
    PoolAccountant,
    account_while_leading,
)
from cnidra.ipam.allocator import Allocator
from cnidra.ipam.reconcile import IPAMReconciler
from cnidra.kube.api import (
    DeviceClass,
    Node,
    Pod,
    ResourceClaim,
    ResourceClaimStatus,
    ResourceSlice,
    cluster_wide,
    namespaced,
)
from cnidra.kube.claims import ClaimGetter
from cnidra.kube.client import make_client, probe_features
from cnidra.kube.ipam import CNIIPBlock, CNIIPPool, IPAMClaim, KubeIPAM
from cnidra.kube.networks import CNINetwork, ServedNetworks
from cnidra.kube.pods import NodePods
from cnidra.kube.session import ApiStatus, AsyncClient
from cnidra.observe import metrics
from cnidra.state.ipam import IPAMState
from cnidra.state.layout import StateLayout
from testbed.components import apiserver_argv, etcd_argv, scheduler_argv
from testbed.layout import APISERVER_PORT, ETCD_CLIENT, ETCD_PEER, PAUSE_IMAGE, REPO, Bins
from testbed.pki import kubeconfig, make_pki

EXAMPLE_DRIVER = "gpu.example.com"
GPUS = 8  # a node's devices in dra-example-driver's shape
CNIDRA_CLASS = "cni.networking.x-k8s.io"
FLEET_LABEL = "bench.cnidra/fleet"
ROUND_LABEL = "bench.cnidra/round"
AHEAD_TAG = "ahead"  # the claims-ahead pods' and claims' ROUND_LABEL
NODE_PODS = 110  # kubelet's default maxPods: --ahead-pods at most
NAMESPACE = "default"
POOL = "fleet-pool"
IN_FLIGHT = 32  # requests the bench has open at once when it builds the fleet
SETTLE = 5.0  # seconds for the scheduler's informers to see a fleet's slices
WARM_UP = 20.0  # seconds after the sample's last node started before its requests are counted
# the test bed's ports (and kubelet's, the controller-manager's, the scheduler's defaults):
# never picked, even when free at the moment
RESERVED_PORTS = {
    APISERVER_PORT,
    int(ETCD_CLIENT.rsplit(":", 1)[1]),
    int(ETCD_PEER.rsplit(":", 1)[1]),
    10250,
    10257,
    10259,
}

# the CNI reference plugins (v1.9) and cnidra's IPAM: what a node's CNI path has (host-local
# among them: the admin's named networks use it; a claim's own network may not, so the claims
# take their addresses from the pool)
PLUGINS = [
    "bandwidth",
    "bridge",
    "dhcp",
    "dummy",
    "firewall",
    "host-device",
    "host-local",
    "ipvlan",
    "loopback",
    "macvlan",
    "portmap",
    "ptp",
    "sbr",
    "static",
    "tap",
    "tuning",
    "vlan",
    "vrf",
    "cnidra",
]

# ------------------------------------------------------------------ the fleet's objects (pure)


# only the benchmark range 198.18.0.0/15, as every address of the tests (none of these is
# configured on a link: they are what the fake nodes' objects say); node IPs from 198.18.0.1
POOL_SUBNET = "198.19.0.0/16"
MAX_NODES = 4096  # the pool's blocks of 16 addresses, one a node


def node_name(index: int) -> str:
    return f"fleet-{index:05d}"


def node_ip(index: int) -> str:
    return str(ipaddress.IPv4Address("198.18.0.0") + index + 1)


def node_object(name: str, ip: str, now: str) -> dict[str, Any]:
    """A Node as a kubelet registers it, Ready; no kubelet behind it."""
    resources = {"cpu": "64", "memory": "256Gi", "pods": "110", "ephemeral-storage": "500Gi"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                FLEET_LABEL: "true",
            },
        },
        "spec": {},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "a fake node of bench.fleet",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": ip},
                {"type": "Hostname", "address": name},
            ],
        },
    }


def _nic(
    name: str,
    index: int,
    pci: str,
    vendor: str,
    device: str,
    speed: int,
    numa: int,
    vfs: int | None,
) -> Link:
    mac = f"0c:42:a1:{index:02x}:{int(pci[5:7], 16):02x}:{int(pci[-1]):02x}"
    return Link(
        name,
        index,
        mac,
        9000,
        "physical",
        None,
        "up",
        speed_mbps=speed,
        pci_address=pci,
        pci_vendor=vendor,
        pci_device=device,
        numa_node=numa,
        sriov_vfs=vfs,
        carrier=True,
    )


def node_links(index: int, ip: str, seed: int = 0) -> list[Link]:
    """A node's links as cnidra's inventory reads them (cnidra.inventory.links.read_links):
    what a worker with two dual-port data NICs looks like, varied per node. Published: the two
    ConnectX-5 ports and 2-6 of (a second NIC's two 100G ports, a bond, two VLANs, a bridge);
    not published: loopback, the primary NIC (the node's address and default route), the
    primary network's bridge and pods' veths."""
    rng = random.Random(seed * 1_000_003 + index)
    links = [
        Link("lo", 1, "00:00:00:00:00:00", 65536, "virtual", None, "unknown", loopback=True),
        dataclasses.replace(
            _nic("eth0", 2, "0000:00:03.0", "0x1af4", "0x1041", 10000, 0, None),
            mtu=1500,
            ipv4=(f"{ip}/9",),
            default_route=True,
        ),
        _nic("ens2f0", 3, "0000:3b:00.0", "0x15b3", "0x1017", 25000, 0, 8),
        _nic("ens2f1", 4, "0000:3b:00.1", "0x15b3", "0x1017", 25000, 0, 8),
        Link(
            "cni0",
            5,
            "0a:58:0a:f4:00:01",
            1500,
            "bridge",
            "bridge",
            "up",
            ipv4=("198.18.244.1/24",),
        ),
    ]
    links += [
        Link(
            f"veth{rng.getrandbits(32):08x}",
            6 + i,
            f"ee:ee:ee:ee:ee:{i:02x}",
            1500,
            "virtual",
            "veth",
            "up",
            master=5,
            peer_elsewhere=True,
        )
        for i in range(2)
    ]
    extras = [
        _nic("ens3f0", 10, "0000:5e:00.0", "0x8086", "0x159b", 100000, 1, 128),
        _nic("ens3f1", 11, "0000:5e:00.1", "0x8086", "0x159b", 100000, 1, 128),
        Link("bond0", 12, "0c:42:a1:00:00:12", 9000, "bond", "bond", "up", speed_mbps=50000),
        Link("ens2f0.100", 13, "0c:42:a1:00:00:13", 9000, "vlan", "vlan", "up", lower=3),
        Link("ens2f1.200", 14, "0c:42:a1:00:00:14", 9000, "vlan", "vlan", "up", lower=4),
        Link("br-data", 15, "0c:42:a1:00:00:15", 9000, "bridge", "bridge", "unknown", carrier=True),
    ]
    links += sorted(rng.sample(extras, rng.randint(2, 6)), key=lambda link: link.index)
    return links


def cninetworks() -> list[dict[str, Any]]:
    """The cluster's named networks: storage on every node's second port, a tenant network
    with cnidra IPAM on the first, a fast lane only where the node has the 100G NIC."""

    def net(name: str, plugin: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": "CNINetwork",
            "metadata": {"name": name},
            "spec": {
                "type": plugin["type"],
                "config": {"cniVersion": "1.0.0", "name": name, "plugins": [plugin]},
                "namespaces": [NAMESPACE],
            },
        }

    return [
        net(
            "storage",
            {
                "type": "macvlan",
                "master": "ens2f1",
                "mode": "bridge",
                "ipam": {"type": "host-local", "ranges": [[{"subnet": "198.18.248.0/22"}]]},
            },
        ),
        net(
            "tenant-data",
            {"type": "macvlan", "master": "ens2f0", "ipam": {"type": "cnidra", "pool": POOL}},
        ),
        net(
            "fast-lane",
            {
                "type": "ipvlan",
                "master": "ens3f0",
                "mode": "l2",
                "ipam": {"type": "host-local", "ranges": [[{"subnet": "198.18.252.0/22"}]]},
            },
        ),
    ]


def pool_object() -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "CNIIPPool",
        "metadata": {"name": POOL},
        "spec": {
            "ranges": [{"subnet": POOL_SUBNET, "gateway": "198.19.0.1"}],
            "blockSize": 16,
            "namespaces": [NAMESPACE],
        },
    }


def example_slice(node: str, node_uid: str) -> dict[str, Any]:
    """A node's slice in dra-example-driver's shape (its README's `kubectl get resourceslice -o
    yaml`): one pool named after the node, 8 GPUs with index, uuid, model and driverVersion,
    and 80Gi of memory each; owned by the Node, as the kubelet plugin helper makes it."""
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "index": {"int": i},
                "uuid": {"string": f"gpu-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/{i}')}"},
                "model": {"string": "LATEST-GPU-MODEL"},
                "driverVersion": {"version": "1.0.0"},
            },
            "capacity": {"memory": {"value": "80Gi"}},
        }
        for i in range(GPUS)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": f"{node}-{EXAMPLE_DRIVER}-0",
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": node,
                    "uid": node_uid,
                    "controller": True,
                }
            ],
        },
        "spec": {
            "driver": EXAMPLE_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def example_class() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": EXAMPLE_DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{EXAMPLE_DRIVER}"'}}]},
    }


LINK_SELECTOR = (
    f'device.attributes["{DRIVER_NAME}"].ifName == "ens2f0" && '
    f'device.attributes["{DRIVER_NAME}"].cniMacvlan'
)


def claim_object(name: str, driver: str, tag: str) -> dict[str, Any]:
    """One device: for cnidra a link picked by CEL with one sub-interface of it and the
    macvlan network the pod gets on it (as docs/inventory.md's example); for the example
    driver one GPU."""
    if driver == DRIVER_NAME:
        devices: dict[str, Any] = {
            "requests": [
                {
                    "name": "net",
                    "exactly": {
                        "deviceClassName": CNIDRA_CLASS,
                        "selectors": [{"cel": {"expression": LINK_SELECTOR}}],
                        "capacity": {"requests": {"subInterfaces": "1"}},
                    },
                }
            ],
            "config": [
                {
                    "requests": ["net"],
                    "opaque": {
                        "driver": DRIVER_NAME,
                        "parameters": {
                            "apiVersion": API_VERSION,
                            "kind": "CNIConfig",
                            "ifName": "net1",
                            "config": {
                                "cniVersion": "1.0.0",
                                "name": "data",
                                "plugins": [
                                    {
                                        "type": "macvlan",
                                        "mode": "bridge",
                                        "ipam": {"type": "cnidra", "pool": POOL},
                                    }
                                ],
                            },
                        },
                    },
                }
            ],
        }
    else:
        devices = {"requests": [{"name": "gpu", "exactly": {"deviceClassName": EXAMPLE_DRIVER}}]}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {ROUND_LABEL: tag}},
        "spec": {"devices": devices},
    }


def policy_samples() -> list[dict[str, Any]]:
    """The claims the fleet's pods use and the pool they name, for tests/bench's check against
    the shipped policy (the fleet prepares none: no kubelet)."""
    return [pool_object(), claim_object("c0", DRIVER_NAME, "r0")]


def pick_nodes(nodes: Sequence[str], count: int, rng: random.Random) -> list[str]:
    """A random node for each of `count` pods, none given more than GPUS (the example fleet's
    devices a node: a round never asks a node for more than either fleet has)."""
    if count > GPUS * len(set(nodes)):
        raise ValueError(f"{count} pods do not fit {len(nodes)} nodes of {GPUS} GPUs")
    given: Counter[str] = Counter()
    out = []
    for _ in range(count):
        node = rng.choice(nodes)
        while given[node] >= GPUS:
            node = rng.choice(nodes)
        given[node] += 1
        out.append(node)
    return out


def pod_object(name: str, node: str, claim: str, tag: str) -> dict[str, Any]:
    """Pinned to `node` by nodeSelector (the scheduler's NodeAffinity pre-filter leaves that
    node alone), with the claim by name."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {ROUND_LABEL: tag}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": "dev", "resourceClaimName": claim}],
            "containers": [
                {"name": "app", "image": PAUSE_IMAGE, "resources": {"claims": [{"name": "dev"}]}}
            ],
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 0,
        },
    }


def bound_pod_object(name: str, node: str, claim: str, tag: str) -> dict[str, Any]:
    """A pod already bound to `node` (spec.nodeName: what the scheduler's binding writes),
    with the claim by name."""
    pod = pod_object(name, node, claim, tag)
    del pod["spec"]["nodeSelector"]
    pod["spec"]["nodeName"] = node
    return pod


def reserved_status(claim: str, node: str, pod: str, pod_uid: str) -> dict[str, Any]:
    """The claim's status as the scheduler leaves it for a pod bound to `node`: one of the
    node's devices allocated to the request, and the pod in reservedFor."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim, "namespace": NAMESPACE},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "net", "driver": DRIVER_NAME, "pool": node, "device": "eth1"}
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": pod, "uid": pod_uid}],
        },
    }


# ------------------------------------------------------------------ figures (pure)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); q in [0, 1]."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def request_kind(method: str, path: str, query: str = "", content_type: str = "") -> str:
    """`WATCH cninetworks`, `LIST cniipblocks`, `GET cniippools`, `APPLY resourceslices`...:
    a request as the driver's own counter names it (cnidra.observe.metrics.request_kind)."""
    verb, resource = metrics.request_kind(method, path, query, content_type)
    return f"{verb.upper()} {resource}"


def per_node_per_minute(count: int, nodes: int, seconds: float) -> float:
    return count / nodes / (seconds / 60.0) if nodes and seconds > 0 else float("nan")


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ([^ ]+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def histogram_totals(
    text: str, metric: str, match: Mapping[str, str], by: str | None = None
) -> dict[str, tuple[float, float]]:
    """From Prometheus text: (sum, count) of histogram `metric` over the series whose labels
    include `match`, added up per value of label `by` ("" without one)."""
    out: dict[str, tuple[float, float]] = {}
    for line in text.splitlines():
        found = _SAMPLE.match(line)
        if not found or found.group(1) not in (f"{metric}_sum", f"{metric}_count"):
            continue
        labels = dict(_LABEL.findall(found.group(2) or ""))
        if any(labels.get(k) != v for k, v in match.items()):
            continue
        key = labels.get(by, "") if by else ""
        total, count = out.get(key, (0.0, 0.0))
        value = float(found.group(3))
        if found.group(1).endswith("_sum"):
            total += value
        else:
            count += value
        out[key] = (total, count)
    return out


def histogram_delta(
    before: Mapping[str, tuple[float, float]],
    after: Mapping[str, tuple[float, float]],
    into: dict[str, tuple[float, float]] | None = None,
) -> dict[str, tuple[float, float]]:
    """The observations made between two readings (sum, count per key), added to `into`."""
    out = into if into is not None else {}
    for key, (total, count) in after.items():
        total0, count0 = before.get(key, (0.0, 0.0))
        have = out.get(key, (0.0, 0.0))
        out[key] = (have[0] + total - total0, have[1] + count - count0)
    return out


def means_ms(totals: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    return {
        key or "all": round(1000 * total / count, 2)
        for key, (total, count) in sorted(totals.items())
        if count > 0
    }


# what the scheduler says of its own time: a scheduling cycle (filter, score, reserve: not the
# queue, not the binding), DRA's plugin at each extension point (sampled: about 1 cycle in
# 10), PreBind (where the claim's allocation is written)
SCHEDULER_HISTOGRAMS = {
    "attempt_ms": ("scheduler_scheduling_attempt_duration_seconds", {"result": "scheduled"}, None),
    "dra_plugin_ms": (
        "scheduler_plugin_execution_duration_seconds",
        {"plugin": "DynamicResources"},
        "extension_point",
    ),
    "prebind_ms": (
        "scheduler_framework_extension_point_duration_seconds",
        {"extension_point": "PreBind"},
        None,
    ),
}


def scheduler_times(text: str) -> dict[str, dict[str, tuple[float, float]]]:
    return {
        name: histogram_totals(text, metric, match, by)
        for name, (metric, match, by) in SCHEDULER_HISTOGRAMS.items()
    }


SUMMARY_KEYS = (
    "nodes",
    "slices",
    "slice_bytes_per_node",
    "idle_requests_per_node_per_min",
    "schedule_p50_ms",
    "schedule_p99_ms",
    "dra_example_schedule_p99_ms",
    "apiserver_rss_mib",
    "claims_ahead_vmrss_mib",
    "claims_ahead_added_rssanon_mib",
    "claims_ahead_requests_per_min",
)


def finite(value: Any) -> Any:
    """JSON as it is: a figure that could not be measured (NaN) is null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def summary(detail: Mapping[str, Any]) -> dict[str, Any]:
    """The last line: the issue's figures, from the run's detail (null: not measured)."""
    cnidra, example = detail["schedule"]["cnidra"], detail["schedule"]["dra_example"]
    ahead = detail.get("claims_ahead") or {}
    line: dict[str, Any] = finite(
        {
            "nodes": detail["nodes"],
            "slices": detail["cnidra"]["slices"],
            "slice_bytes_per_node": detail["cnidra"]["slice_bytes_per_node"],
            "idle_requests_per_node_per_min": detail["idle"]["requests_per_node_per_min"],
            "schedule_p50_ms": cnidra["allocated_p50_ms"],
            "schedule_p99_ms": cnidra["allocated_p99_ms"],
            "dra_example_schedule_p99_ms": example["allocated_p99_ms"],
            "apiserver_rss_mib": detail["apiserver"]["rss_mib_cnidra_fleet"],
            "claims_ahead_vmrss_mib": ahead.get("vmrss_mib", float("nan")),
            "claims_ahead_added_rssanon_mib": ahead.get("added_rssanon_mib", float("nan")),
            "claims_ahead_requests_per_min": ahead.get("rest_requests_per_min", float("nan")),
        }
    )
    return line


# ------------------------------------------------------------------ processes


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """PR_SET_PDEATHSIG: the component dies with this process, whatever kills it."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 now, none of the test bed's; held open until all are chosen, so
    they differ."""
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            held.append(s)
            port = int(s.getsockname()[1])
            if port not in RESERVED_PORTS:
                ports.append(port)
    finally:
        for s in held:
            s.close()
    return ports


class Proc:
    """One component, started by this process (its own session, killed with it), stopped by
    its pid only."""

    def __init__(self, name: str, argv: Sequence[str], logs: Path) -> None:
        self.name = name
        self.log = logs / f"{name}.log"
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - before any thread of ours
                cwd=logs,
            )
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.popen.kill()
            self.popen.wait(5)

    def cpu_seconds(self) -> float:
        """utime + stime (/proc/<pid>/stat), in seconds."""
        stat = Path(f"/proc/{self.pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def _wait(what: str, check: Callable[[], bool], timeout: float, proc: Proc) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():
                return
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited waiting for {what}:\n{proc.tail()}")
        time.sleep(0.25)
    raise TimeoutError(f"{what} not reached in {timeout:.0f} s")


class ControlPlane:
    """etcd, kube-apiserver and kube-scheduler of the test bed's build, on free loopback ports,
    under a temporary directory (`keep`: its logs are copied there at the end)."""

    def __init__(self, bins: Bins, keep: Path | None = None) -> None:
        self.bins = bins
        self.keep = keep
        self.work = Path(tempfile.mkdtemp(prefix="cnidra-fleet-"))
        self.logs = self.work / "logs"
        self.logs.mkdir()
        self.pki = self.work / "pki"
        self.procs: dict[str, Proc] = {}
        etcd_client, etcd_peer, self.port, self.scheduler_port = free_ports(4)
        self.etcd = f"127.0.0.1:{etcd_client}"
        self.etcd_peer = f"127.0.0.1:{etcd_peer}"
        self.admin = self.work / "admin.kubeconfig"

    def start(self, scheduler: bool = True) -> None:
        """etcd, then the apiserver, then (`scheduler`) the scheduler, each waited for."""
        started = time.monotonic()
        make_pki(self.pki)
        kubeconfig(self.admin, "admin", self.pki, self.port)
        scheduler = self.work / "scheduler.kubeconfig"
        kubeconfig(scheduler, "scheduler", self.pki, self.port)
        etcd = self._start(
            "etcd", etcd_argv(self.bins, self.work / "etcd", self.etcd, self.etcd_peer, "fleet")
        )
        _wait("etcd", lambda: self.etcd_metric("etcd_server_has_leader") == 1, 60, etcd)
        api = self._start(
            "kube-apiserver",
            apiserver_argv(self.bins, pki=self.pki, etcd=self.etcd, port=self.port),
        )
        with self.http() as http:
            _wait("/readyz", lambda: http.get("/readyz").text == "ok", 180, api)
        if not scheduler:
            say(f"etcd and apiserver up in {time.monotonic() - started:.1f} s under {self.work}")
            return
        sched = self._start(
            "kube-scheduler",
            [*scheduler_argv(self.bins, scheduler), f"--secure-port={self.scheduler_port}"],
        )
        url = f"https://127.0.0.1:{self.scheduler_port}/healthz"
        _wait("the scheduler", lambda: httpx2.get(url, verify=False).text == "ok", 60, sched)
        say(f"control plane up in {time.monotonic() - started:.1f} s under {self.work}")

    def _start(self, name: str, argv: Sequence[str]) -> Proc:
        proc = Proc(name, argv, self.logs)
        self.procs[name] = proc
        return proc

    def http(self) -> httpx2.Client:
        """The admin's raw HTTPS client (readiness, protobuf reads)."""
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        context.load_cert_chain(self.pki / "admin.crt", self.pki / "admin.key")
        return httpx2.Client(
            base_url=f"https://127.0.0.1:{self.port}", verify=context, timeout=30.0
        )

    def apiserver_heap_live_mib(self) -> float:
        with self.http() as http:
            text = http.get("/metrics").text
        found = re.search(r"^go_gc_heap_live_bytes ([^ \n]+)$", text, re.M)
        return float(found[1]) / (1 << 20) if found else float("nan")

    def scheduler_metrics(self) -> str:
        """The scheduler's /metrics (its serving certificate is its own, self-signed; the
        admin's client certificate is authorized through the apiserver)."""
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        context.load_cert_chain(self.pki / "admin.crt", self.pki / "admin.key")
        url = f"https://127.0.0.1:{self.scheduler_port}/metrics"
        return httpx2.get(url, verify=context, timeout=30.0).text

    def etcd_metric(self, name: str) -> float:
        text = httpx2.get(f"http://{self.etcd}/metrics", timeout=10.0).text
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return float("nan")

    def stop(self) -> None:
        for name in ("kube-scheduler", "kube-apiserver", "etcd"):
            if name in self.procs:
                self.procs[name].stop()
        if self.keep is not None:
            with contextlib.suppress(OSError):
                self.keep.mkdir(parents=True, exist_ok=True)
                for log in self.logs.iterdir():
                    shutil.copy(log, self.keep / log.name)
        shutil.rmtree(self.work, ignore_errors=True)


def load_average() -> float:
    """The machine's 1-minute load average: what else wanted its 2 cores meanwhile."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def say(message: str) -> None:
    print(f"[fleet {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ building the fleet


async def each(items: Iterable[Any], work: Callable[[Any], Awaitable[Any]]) -> list[Any]:
    slots = asyncio.Semaphore(IN_FLIGHT)

    async def one(item: Any) -> Any:
        async with slots:
            return await work(item)

    return list(await asyncio.gather(*(one(i) for i in items)))


CustomResourceDefinition = cluster_wide(
    "apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions"
)
ServiceAccount = namespaced("", "v1", "ServiceAccount", "serviceaccounts")


async def install_basics(client: AsyncClient) -> None:
    """cnidra's CRDs and DeviceClasses, the example driver's class, the named networks and the
    pool, and the namespace's ServiceAccount (no controller-manager makes it)."""
    crds = REPO / "charts" / "cnidra" / "crds"
    for path in sorted(crds.glob("*.yaml")):
        await client.create(CustomResourceDefinition, yaml.safe_load(path.read_text()))
    for path in sorted(crds.glob("*.yaml")):
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        for _ in range(100):
            crd = await client.get(CustomResourceDefinition, name)
            conditions = (crd.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                break
            await asyncio.sleep(0.1)
    for kind in (CNINetwork, CNIIPPool, CNIIPBlock, IPAMClaim):
        await served(client, kind)
    classes = [d for d in yaml.safe_load_all((REPO / "deploy" / "deviceclass.yaml").read_text())]
    for obj in [*classes, example_class()]:
        if obj:
            await client.create(DeviceClass, obj)
    for net in cninetworks():
        await client.create(CNINetwork, net)
    await client.create(CNIIPPool, pool_object())
    sa = {"metadata": {"name": "default", "namespace": NAMESPACE}}
    await client.create(ServiceAccount, sa)


async def served(client: AsyncClient, kind: Any) -> None:
    """Until the apiserver lists a new CRD's objects (right after Established it may still
    answer "storage is (re)initializing")."""
    for _ in range(300):
        try:
            listed = (
                client.list(kind, namespace="*", chunk_size=1)
                if kind is IPAMClaim
                else client.list(kind, chunk_size=1)
            )
            async for _ in listed:
                break
            return
        except ApiStatus:
            await asyncio.sleep(0.1)
    raise TimeoutError(f"{kind.kind} not served")


async def make_nodes(client: AsyncClient, count: int) -> dict[str, str]:
    """name -> UID; each node also reserves one block of the pool, as the driver does at its
    first claim with cnidra IPAM (the driver's KubeIPAM writes it, owned by the Node). No
    controller-manager runs, so nothing marks the nodes NotReady later."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ipam = KubeIPAM(client, 30.0)
    pool = pool_from_object(pool_object())

    async def one(index: int) -> tuple[str, str]:
        name = node_name(index)
        made = await client.create(Node, node_object(name, node_ip(index), now))
        # the not-ready taint the TaintNodesByCondition admission puts on every new Node:
        # the node lifecycle controller would lift it once it sees the node Ready
        await client.patch(Node, name, {"spec": {"taints": None}}, patch_type="merge")
        await ipam.create_block(pool.block(0, index), name)
        return name, str(made["metadata"]["uid"])

    return dict(await each(range(count), one))


class StaticNetworks:
    """The named networks as one ServedNetworks read found them (the bulk publish shares it:
    the fleet's nodes all have the same view; the sample runs the real thing)."""

    def __init__(self, served: list[tuple[str, NamedNetwork]]) -> None:
        self._served = served

    async def served(self) -> list[tuple[str, NamedNetwork]]:
        return self._served

    async def watch(self, changed: Callable[[], None]) -> None:
        await asyncio.Event().wait()


class FleetPublisher(SlicePublisher):
    """The driver's publisher for a fake node: its links are the synthetic inventory, which
    never changes, so there is no netlink to follow (this machine's own link events, from the
    test bed's pods, are no fake node's)."""

    async def _watch_netlink(self) -> None:
        await asyncio.Event().wait()


def constant(links: list[Link]) -> Callable[[], list[Link]]:
    return lambda: links


def plugin_dir(work: Path) -> Path:
    """A CNI path holding the reference plugins' names (what cni_plugins scans)."""
    path = work / "cni-bin"
    path.mkdir(exist_ok=True)
    for name in PLUGINS:
        exe = path / name
        exe.write_text("#!/bin/sh\nexit 1\n")
        exe.chmod(0o755)
    return path


async def publish_cnidra(
    client: AsyncClient,
    nodes: Sequence[str],
    cni_bin: Path,
    networks: StaticNetworks,
    addresses: int,
    seed: int,
) -> None:
    """Each node's slices through the driver's own SlicePublisher as its start does it: read
    the Node (owner, addresses), adopt what exists, publish with server-side apply."""
    settings = DriverSettings(node_name="x")

    async def one(index: int) -> None:
        name = nodes[index]
        links = node_links(index, node_ip(index), seed)

        async def capacity(_: str) -> int:
            return addresses

        publisher = FleetPublisher(
            client,
            SliceSettings(name, settings.sub_interfaces, taint_effect=settings.link_failure_taint),
            [str(cni_bin)],
            LinkFilter(settings.include_interfaces, settings.exclude_interfaces),
            links=constant(links),
            networks=networks,
            pool_capacity=capacity,
        )
        owner = await publisher._node_owner()
        await publisher._adopt_existing()
        await publisher.publish_if_changed(owner)

    await each(range(len(nodes)), one)


async def publish_example(client: AsyncClient, uids: Mapping[str, str]) -> None:
    async def one(node: str) -> None:
        await client.create(ResourceSlice, example_slice(node, uids[node]))

    await each(sorted(uids), one)


async def delete_slices(client: AsyncClient, driver: str) -> int:
    names = [
        s["metadata"]["name"]
        async for s in client.list(ResourceSlice, fields={"spec.driver": driver})
    ]

    async def one(name: str) -> None:
        with contextlib.suppress(ApiStatus):
            await client.delete(ResourceSlice, name)

    await each(names, one)
    return len(names)


def slice_sizes(plane: ControlPlane, driver: str, nodes: Sequence[str]) -> dict[str, Any]:
    """A node's slices as etcd stores them (protobuf, what the scheduler's watch carries) and
    as a JSON client reads them, averaged over `nodes`; managedFields included (they are
    stored)."""
    proto, as_json, count = 0, 0, 0
    with plane.http() as http:
        for node in nodes:
            listed = http.get(
                "/apis/resource.k8s.io/v1/resourceslices",
                params={"fieldSelector": f"spec.nodeName={node},spec.driver={driver}"},
            ).json()
            for item in listed["items"]:
                path = f"/apis/resource.k8s.io/v1/resourceslices/{item['metadata']['name']}"
                one = http.get(path, headers={"Accept": "application/vnd.kubernetes.protobuf"})
                proto += len(one.content)
                as_json += len(http.get(path).content)
                count += 1
    per = max(len(nodes), 1)
    return {
        "slice_bytes_per_node": round(proto / per),
        "slice_json_bytes_per_node": round(as_json / per),
        "slices_per_node": round(count / per, 2),
    }


def blocks_list_bytes(plane: ControlPlane) -> int:
    """What a node reads each time it counts the pool's addresses: the LIST of the pool's
    CNIIPBlocks (one a node here), as JSON."""
    with plane.http() as http:
        listed = http.get(
            f"/apis/{API_VERSION}/cniipblocks",
            params={"labelSelector": f"{LABEL_POOL}={POOL}"},
        )
        return len(listed.content)


async def count_slices(client: AsyncClient, driver: str) -> tuple[int, int]:
    slices, devices = 0, 0
    async for s in client.list(ResourceSlice, fields={"spec.driver": driver}):
        slices += 1
        devices += len((s.get("spec") or {}).get("devices") or [])
    return slices, devices


# ------------------------------------------------------------------ at rest


@dataclass
class RequestLog:
    """Every request of the sample's clients: when, and what (request_kind)."""

    entries: list[tuple[float, str, str]] = field(default_factory=list)

    def tracer(self, node: str) -> aiohttp.TraceConfig:
        """An aiohttp trace that logs each request the session sends, as `node`'s."""

        async def record(
            _session: aiohttp.ClientSession, _context: Any, params: aiohttp.TraceRequestStartParams
        ) -> None:
            kind = request_kind(
                params.method,
                params.url.path,
                params.url.query_string,
                params.headers.get("Content-Type", ""),
            )
            self.entries.append((time.monotonic(), node, kind))

        trace = aiohttp.TraceConfig()
        trace.on_request_start.append(record)
        return trace

    def between(self, start: float, end: float) -> Counter[str]:
        return Counter(kind for t, _, kind in self.entries if start <= t < end)


def counted_client(
    kubeconfig_path: Path, log: RequestLog, node: str, timeout: float
) -> AsyncClient:
    """The driver's own client (cnidra.kube.client.make_client: its one aiohttp session, its
    timeouts) with a trace on its session that logs each request, watches included, so a
    watch started again at rest is counted."""
    client = make_client(str(kubeconfig_path), timeout)
    client.trace_configs.append(log.tracer(node))
    return client


class SampleNode:
    """One sampled node's driver, as `cnidra driver` wires its apiserver-facing work: the
    cluster feature probe, then the slice publisher (resync, CNINetwork watch, pool counts
    through the allocator), the IPAM reconciler, the block writer and the pool accountant's
    Lease loop (the accountant itself in the one that leads), on its own client (the
    driver's)."""

    def __init__(self, plane: ControlPlane, name: str, cni_bin: Path, seed: int, log: RequestLog):
        index = int(name.rsplit("-", 1)[1])
        self.name = name
        self.settings = DriverSettings(node_name=name, kubeconfig=str(plane.admin))
        self.client = counted_client(plane.admin, log, name, self.settings.api_timeout)
        timeout = self.settings.api_timeout
        state = StateLayout(plane.work / "sample-state" / name)
        self.ipam = Allocator(name, IPAMState(state), KubeIPAM(self.client, timeout))
        conf = plane.work / "sample-conf"  # no node confs: the CNINetworks carry their configs
        conf.mkdir(exist_ok=True)
        self.publisher = FleetPublisher(
            self.client,
            SliceSettings(
                name, self.settings.sub_interfaces, taint_effect=self.settings.link_failure_taint
            ),
            [str(cni_bin)],
            LinkFilter(self.settings.include_interfaces, self.settings.exclude_interfaces),
            resync=self.settings.resync_seconds,
            links=constant(node_links(index, node_ip(index), seed)),
            networks=ServedNetworks(self.client, conf),
            pool_capacity=self.ipam.capacity,
        )
        self.ipam.blocks_changed = self.publisher.poke
        self.reconciler = IPAMReconciler(self.ipam, set, grace=self.settings.ipam_grace_seconds)
        # pool accounting as the driver wires it: the node's leased counts, and the Lease
        # loop (one sample node leads and runs the accountant and names two successors, who ask
        # once a minute; the others ask every ten)
        kube_ipam = KubeIPAM(self.client, timeout, name)
        self.block_leases = BlockLeaseWriter(self.ipam.state, kube_ipam)
        self.accountant = PoolAccountant(
            kube_ipam, DRIVER_NAME, interval=self.settings.pool_status_seconds
        )

        self.kube_ipam = kube_ipam
        # claims read ahead (--read-claims-ahead, on by default): the node-scoped pod watch
        self.read_ahead = ReadAhead(
            NodePods(self.client, name).watch, ClaimGetter(self.client, timeout), ClaimsAhead()
        )
        self.started: float | None = None

    async def run(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self.started = time.monotonic()
        await probe_features(self.client, self.name, DRIVER_NAME)
        await self.publisher.refresh_view()
        await asyncio.gather(
            self.publisher.run(),
            self.reconciler.run(
                self.settings.ipam_reconcile_seconds, self.settings.ipam_lost_node_passes
            ),
            self.block_leases.run(self.settings.pool_status_seconds),
            account_while_leading(
                self.accountant,
                self.kube_ipam,
                self.settings.pool_accountant_namespace,
                self.name,
                LEASE_SECONDS,
            ),
            self.read_ahead.run(),
        )


async def run_sample(
    plane: ControlPlane,
    nodes: Sequence[str],
    cni_bin: Path,
    seed: int,
    idle_seconds: float,
    log: RequestLog | None = None,
) -> dict[str, Any]:
    """SampleNodes on `nodes`, started spread over one resync period (a fleet's drivers are
    not in step); their requests counted from WARM_UP seconds after the last one started, for
    `idle_seconds`."""
    log = log if log is not None else RequestLog()
    api = plane.procs["kube-apiserver"]
    agents = [SampleNode(plane, name, cni_bin, seed, log) for name in nodes]
    period = agents[0].settings.resync_seconds
    tasks = [
        asyncio.create_task(agent.run(i * period / len(agents)), name=f"agent-{agent.name}")
        for i, agent in enumerate(agents)
    ]
    cpu_before, started = api.cpu_seconds(), time.monotonic()
    try:
        await asyncio.sleep(period + WARM_UP)
        for _ in range(240):  # and each has published (2 minutes at most)
            if all(a.publisher.last_publish for a in agents):
                break
            await asyncio.sleep(0.5)
        window_start, cpu_start = time.monotonic(), api.cpu_seconds()
        await asyncio.sleep(idle_seconds)
        window_end, cpu_end = time.monotonic(), api.cpu_seconds()
        for task in tasks:
            if task.done() and task.exception() is not None:
                raise RuntimeError(f"{task.get_name()} failed: {task.exception()!r}")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for agent in agents:
            with contextlib.suppress(Exception):
                await agent.client.close()
    counted = log.between(window_start, window_end)
    start_of = {a.name: a.started or 0.0 for a in agents}
    startup = Counter(  # each node's first WARM_UP seconds
        kind for t, node, kind in log.entries if t < start_of[node] + WARM_UP
    )
    seconds = window_end - window_start
    total = sum(counted.values())
    return {
        "sample_nodes": len(nodes),
        "warm_up_s": round(window_start - started, 1),
        "seconds": round(seconds, 1),
        "requests": total,
        "requests_per_node_per_min": round(per_node_per_minute(total, len(nodes), seconds), 3),
        "by_kind_per_node_per_min": {
            kind: round(per_node_per_minute(n, len(nodes), seconds), 3)
            for kind, n in sorted(counted.items())
        },
        "watches_held_per_node": round(
            sum(n for kind, n in startup.items() if kind.startswith("WATCH")) / len(nodes), 2
        ),
        "startup_requests_per_node": round(sum(startup.values()) / len(nodes), 1),
        "startup_by_kind": dict(sorted(startup.items())),
        "apiserver_cpu_percent": round(100 * (cpu_end - cpu_start) / seconds, 1),
        "apiserver_cpu_s_warm_up": round(cpu_start - cpu_before, 2),
    }


# ------------------------------------------------------------------ claims read ahead


async def place_claims_ahead(
    client: AsyncClient, nodes: Sequence[str], node: str, pods: int, elsewhere: int
) -> dict[str, Any]:
    """`pods` pods bound to `node`, each with a claim allocated and reserved for it as the
    scheduler leaves it, and `elsewhere` pods bound to each other node, each with a claim of
    its own (not allocated: only their own nodes would read them)."""
    t = time.monotonic()
    others = [
        (f"ahead-e{i:05d}-{k}", where)
        for i, where in enumerate(n for n in nodes if n != node)
        for k in range(elsewhere)
    ]

    async def other(item: tuple[str, str]) -> None:
        name, where = item
        await client.create(ResourceClaim, claim_object(name, DRIVER_NAME, AHEAD_TAG))
        await client.create(Pod, bound_pod_object(name, where, name, AHEAD_TAG))

    await each(others, other)
    elsewhere_s = time.monotonic() - t

    async def mine(name: str) -> None:
        await client.create(ResourceClaim, claim_object(name, DRIVER_NAME, AHEAD_TAG))
        made = await client.create(Pod, bound_pod_object(name, node, name, AHEAD_TAG))
        uid = str(made["metadata"]["uid"])
        await client.patch(
            ResourceClaimStatus,
            name,
            reserved_status(name, node, name, uid),
            namespace=NAMESPACE,
            patch_type="apply",
            field_manager="bench-scheduler",
            force=True,
        )

    await each([f"ahead-n{i:04d}" for i in range(pods)], mine)
    return {
        "node": node,
        "pods_on_node": pods,
        "pods_elsewhere": len(others),
        "elsewhere_s": round(elsewhere_s, 1),
        "total_s": round(time.monotonic() - t, 1),
    }


async def run_claims_ahead(
    plane: ControlPlane, node: str, pods: int, seconds: float
) -> dict[str, Any]:
    """bench.claims_ahead on `node`, a process of its own (its memory the driver's shape)."""
    argv = [sys.executable, "-m", "bench.claims_ahead", "--kubeconfig", str(plane.admin)]
    argv += ["--node", node, "--pods", str(pods), "--seconds", str(seconds), "--json"]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), seconds + 300)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0 or not out.strip():
        tail = err.decode(errors="replace")[-3000:]
        raise RuntimeError(f"bench.claims_ahead failed ({proc.returncode}):\n{tail}")
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


# ------------------------------------------------------------------ scheduling


async def schedule_round(
    client: AsyncClient,
    watcher: AsyncClient,
    driver: str,
    nodes: Sequence[str],
    pods: int,
    rate: float,
    tag: str,
    rng: random.Random,
    cpu: Callable[[], float] = lambda: 0.0,
) -> dict[str, Any]:
    """`pods` pods with a claim each, pinned to random nodes, created `rate` a second: from
    each create to its claim's allocation and to its nodeName (watch events). Pods the
    scheduler has not placed a minute after the last create count as unscheduled."""
    claims = [f"{tag}-c{i:04d}" for i in range(pods)]
    names = [f"{tag}-p{i:04d}" for i in range(pods)]
    targets = pick_nodes(nodes, pods, rng)
    sent: dict[int, float] = {}
    allocated: dict[str, float] = {}
    bound: dict[str, float] = {}
    seen_claims: set[str] = set()
    listed, done = asyncio.Event(), asyncio.Event()

    await each(claims, lambda c: client.create(ResourceClaim, claim_object(c, driver, tag)))

    async def watch_claims() -> None:
        async for _, obj in watcher.watch(
            ResourceClaim, namespace=NAMESPACE, labels={ROUND_LABEL: tag}
        ):
            name = obj["metadata"]["name"]
            seen_claims.add(str(name))
            if len(seen_claims) == pods:
                listed.set()  # the watch is live: it has sent every claim
            if (obj.get("status") or {}).get("allocation") and name not in allocated:
                allocated[str(name)] = time.monotonic()

    async def watch_pods() -> None:
        async for _, obj in watcher.watch(Pod, namespace=NAMESPACE, labels={ROUND_LABEL: tag}):
            name = str(obj["metadata"]["name"])
            if (obj.get("spec") or {}).get("nodeName") and name not in bound:
                bound[name] = time.monotonic()
                if len(bound) == pods:
                    done.set()

    watches = [asyncio.create_task(watch_claims()), asyncio.create_task(watch_pods())]
    try:
        await asyncio.wait_for(listed.wait(), 60)
        await asyncio.sleep(0.5)
        start, cpu_start = time.monotonic(), cpu()

        async def create(i: int) -> None:
            await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
            sent[i] = time.monotonic()
            await client.create(Pod, pod_object(names[i], targets[i], claims[i], tag))

        await asyncio.gather(*(create(i) for i in range(pods)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), 60)
        cpu_used = cpu() - cpu_start
    finally:
        for task in watches:
            task.cancel()
        await asyncio.gather(*watches, return_exceptions=True)
    to_claim = [(allocated[claims[i]] - sent[i]) * 1000 for i in sent if claims[i] in allocated]
    to_node = [(bound[names[i]] - sent[i]) * 1000 for i in sent if names[i] in bound]
    return {
        "pods": pods,
        "scheduled": len(to_node),
        "allocated": len(to_claim),
        "allocated_ms": to_claim,
        "bound_ms": to_node,
        "cpu_s": cpu_used,
    }


async def clean_round(client: AsyncClient, tag: str) -> None:
    """The round's pods (grace 0: no kubelet answers) and claims (their allocation's finalizer
    dropped: no controller-manager deallocates)."""
    pods = [
        p["metadata"]["name"]
        async for p in client.list(Pod, namespace=NAMESPACE, labels={ROUND_LABEL: tag})
    ]
    await each(pods, lambda n: client.delete(Pod, n, namespace=NAMESPACE, grace_period=0))
    claims = [
        c["metadata"]["name"]
        async for c in client.list(ResourceClaim, namespace=NAMESPACE, labels={ROUND_LABEL: tag})
    ]

    async def drop(name: str) -> None:
        with contextlib.suppress(ApiStatus):
            await client.patch(
                ResourceClaim,
                name,
                {"metadata": {"finalizers": None}},
                namespace=NAMESPACE,
                patch_type="merge",
            )
            await client.delete(ResourceClaim, name, namespace=NAMESPACE)

    await each(claims, drop)


def stats(values: Sequence[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(values, 0.5), 1),
        "p99": round(percentile(values, 0.99), 1),
        "max": round(max(values), 1) if values else float("nan"),
    }


# ------------------------------------------------------------------ the run


async def run(args: argparse.Namespace, plane: ControlPlane) -> dict[str, Any]:  # noqa: PLR0915 - one linear script of measurements
    api = plane.procs["kube-apiserver"]
    sched = plane.procs["kube-scheduler"]
    rng = random.Random(args.seed)
    detail: dict[str, Any] = {
        "nodes": args.nodes,
        "apiserver": {},
        "timings_s": {},
        "cpus": os.cpu_count(),
        "loadavg_1m_at_start": load_average(),
    }

    def memory(tag: str) -> None:
        """The apiserver's RSS, and its live heap as of its last GC (RSS keeps what the heap
        grew to under churn: a write's garbage, GOGC=100's headroom)."""
        detail["apiserver"][f"rss_mib_{tag}"] = round(api.rss_mib(), 1)
        detail["apiserver"][f"heap_live_mib_{tag}"] = round(plane.apiserver_heap_live_mib(), 1)

    client = make_client(str(plane.admin), 30.0)
    watcher = make_client(str(plane.admin), 30.0)
    try:
        await install_basics(client)
        memory("empty")

        t = time.monotonic()
        uids = await make_nodes(client, args.nodes)
        nodes = sorted(uids)
        took = time.monotonic() - t
        detail["timings_s"]["nodes"] = round(took, 1)
        say(f"{len(nodes)} nodes (and their pool blocks) in {took:.1f} s")
        memory("nodes")
        etcd_nodes = plane.etcd_metric("etcd_mvcc_db_total_size_in_use_in_bytes")
        detail["pool_blocks_list_bytes"] = blocks_list_bytes(plane)

        cni_bin = plugin_dir(plane.work)
        served = await ServedNetworks(client, plane.work / "conf").served()
        first = Allocator(nodes[0], IPAMState(StateLayout(plane.work / "probe")), KubeIPAM(client))
        addresses = await first.capacity(POOL) or 0
        networks = StaticNetworks(served)

        async def cnidra_fleet() -> None:
            t = time.monotonic()
            await publish_cnidra(client, nodes, cni_bin, networks, addresses, args.seed)
            say(f"cnidra's slices for {len(nodes)} nodes in {time.monotonic() - t:.1f} s")
            detail["timings_s"].setdefault("cnidra_publish", round(time.monotonic() - t, 1))

        async def example_fleet() -> None:
            t = time.monotonic()
            await publish_example(client, uids)
            say(f"dra-example's slices for {len(nodes)} nodes in {time.monotonic() - t:.1f} s")
            detail["timings_s"].setdefault("example_publish", round(time.monotonic() - t, 1))

        await cnidra_fleet()
        await asyncio.sleep(2)
        slices, devices = await count_slices(client, DRIVER_NAME)
        sizes_of = nodes[:: max(1, len(nodes) // 20)]
        detail["cnidra"] = {
            "slices": slices,
            "devices": devices,
            "devices_per_node": round(devices / len(nodes), 2),
            **slice_sizes(plane, DRIVER_NAME, sizes_of),
        }
        etcd_cnidra = plane.etcd_metric("etcd_mvcc_db_total_size_in_use_in_bytes")
        memory("cnidra_published")
        detail["cnidra"]["etcd_bytes_per_node"] = round((etcd_cnidra - etcd_nodes) / len(nodes))

        sample = nodes[: min(len(nodes), args.sample)]
        if args.ahead_pods:
            placed = await place_claims_ahead(
                client, nodes, nodes[-1], args.ahead_pods, args.ahead_elsewhere
            )
            detail["timings_s"]["claims_ahead_pods"] = placed["total_s"]
            say(
                f"claims ahead: {args.ahead_pods} pods with claims bound to {nodes[-1]}, "
                f"{placed['pods_elsewhere']} elsewhere, in {placed['total_s']} s"
            )
        say(
            f"at rest: the driver's background work on {len(sample)} nodes, "
            f"starting over a resync period, then {WARM_UP:.0f} s and {args.idle_seconds:.0f} s "
            "counted"
            + (f"; beside it one driver's claims ahead on {nodes[-1]}" if args.ahead_pods else "")
        )
        sampled = run_sample(plane, sample, cni_bin, args.seed, args.idle_seconds)
        if args.ahead_pods:
            detail["idle"], ahead = await asyncio.gather(
                sampled, run_claims_ahead(plane, nodes[-1], args.ahead_pods, args.idle_seconds)
            )
            detail["claims_ahead"] = {**placed, **ahead}
            say(
                f"claims ahead: {ahead['claims_kept']} kept, VmRSS {ahead['vmrss_mib']} MiB "
                f"(+{ahead['added_vmrss_mib']}), RssAnon {ahead['rssanon_mib']} MiB "
                f"(+{ahead['added_rssanon_mib']}), {ahead['held_kib']} KiB held; at rest "
                f"{ahead['rest_requests_per_min']} requests a minute"
            )
        else:
            detail["idle"] = await sampled
        say(
            f"at rest: {detail['idle']['requests_per_node_per_min']} requests per node per "
            f"minute: {detail['idle']['by_kind_per_node_per_min']}"
        )
        memory("cnidra_fleet")
        if args.ahead_pods:
            await clean_round(client, AHEAD_TAG)

        results: dict[str, dict[str, list[float]]] = {
            "cnidra": {"allocated_ms": [], "bound_ms": []},
            "dra_example": {"allocated_ms": [], "bound_ms": []},
        }
        cpu: dict[str, float] = {"cnidra": 0.0, "dra_example": 0.0}
        own: dict[str, dict[str, dict[str, tuple[float, float]]]] = {
            way: {name: {} for name in SCHEDULER_HISTOGRAMS} for way in cpu
        }
        unscheduled: Counter[str] = Counter()
        per_round: list[dict[str, Any]] = []
        ways = [("cnidra", DRIVER_NAME), ("dra_example", EXAMPLE_DRIVER)]
        published = "cnidra"
        for r in range(args.rounds):
            for way, driver in ways if r % 2 == 0 else ways[::-1]:
                if published != way:  # one fleet at a time: the other's slices go first
                    await delete_slices(client, dict(ways)[published])
                    await (cnidra_fleet() if way == "cnidra" else example_fleet())
                    published = way
                if way == "dra_example" and "dra_example" not in detail:
                    await asyncio.sleep(2)
                    eslices, edevices = await count_slices(client, EXAMPLE_DRIVER)
                    detail["dra_example"] = {
                        "slices": eslices,
                        "devices": edevices,
                        **slice_sizes(plane, EXAMPLE_DRIVER, sizes_of),
                    }
                    memory("example_fleet")
                await asyncio.sleep(SETTLE)
                tag = f"{way.replace('_', '-')}-r{r}"
                if args.warmup_pods:  # the scheduler's first claims of a class (CEL, caches)
                    await schedule_round(
                        client,
                        watcher,
                        driver,
                        nodes,
                        args.warmup_pods,
                        args.rate,
                        f"{tag}-w",
                        rng,
                    )
                    await clean_round(client, f"{tag}-w")
                before = scheduler_times(await asyncio.to_thread(plane.scheduler_metrics))
                got = await schedule_round(
                    client,
                    watcher,
                    driver,
                    nodes,
                    args.pods,
                    args.rate,
                    tag,
                    rng,
                    sched.cpu_seconds,
                )
                after = scheduler_times(await asyncio.to_thread(plane.scheduler_metrics))
                for name in SCHEDULER_HISTOGRAMS:
                    histogram_delta(before[name], after[name], own[way][name])
                cpu[way] += got["cpu_s"]
                per_round.append(
                    {
                        "round": r,
                        "way": way,
                        "allocated_p50_ms": round(percentile(got["allocated_ms"], 0.5), 1),
                        "allocated_p99_ms": round(percentile(got["allocated_ms"], 0.99), 1),
                        "loadavg_1m": load_average(),
                    }
                )
                results[way]["allocated_ms"] += got["allocated_ms"]
                results[way]["bound_ms"] += got["bound_ms"]
                unscheduled[way] += got["pods"] - got["scheduled"]
                say(
                    f"round {r} {way}: allocated p50 {percentile(got['allocated_ms'], 0.5):.1f} "
                    f"p99 {percentile(got['allocated_ms'], 0.99):.1f} ms, "
                    f"{got['scheduled']}/{got['pods']} scheduled (load {load_average()})"
                )
                await clean_round(client, tag)
        detail["schedule"] = {
            way: {
                "pods": len(results[way]["bound_ms"]) + unscheduled[way],
                "unscheduled": unscheduled[way],
                "allocated_p50_ms": stats(results[way]["allocated_ms"])["p50"],
                "allocated_p99_ms": stats(results[way]["allocated_ms"])["p99"],
                "bound_p50_ms": stats(results[way]["bound_ms"])["p50"],
                "bound_p99_ms": stats(results[way]["bound_ms"])["p99"],
                "scheduler_cpu_ms_per_pod": round(
                    1000 * cpu[way] / max(1, args.pods * args.rounds), 2
                ),
                "scheduler_own": {name: means_ms(own[way][name]) for name in own[way]},
            }
            for way in results
        }
        detail["schedule"]["rounds"] = per_round
        memory("end")
        detail["apiserver"]["cpu_s_total"] = round(api.cpu_seconds(), 1)
        detail["scheduler_rss_mib"] = round(sched.rss_mib(), 1)
        detail["etcd_db_bytes_in_use"] = {
            "nodes_only": int(etcd_nodes),
            "with_cnidra_fleet": int(etcd_cnidra),
        }
        return detail
    finally:
        for c in (client, watcher):
            with contextlib.suppress(Exception):
                await c.close()


async def fleet_memory(args: argparse.Namespace, plane: ControlPlane, way: str) -> dict[str, Any]:
    """`--memory`: one fleet on a fresh control plane: the apiserver's live heap and RSS with
    the nodes alone, then with the fleet's slices (15 s after, for a GC to have run)."""
    api = plane.procs["kube-apiserver"]
    client = make_client(str(plane.admin), 30.0)
    try:
        await install_basics(client)
        uids = await make_nodes(client, args.nodes)
        await asyncio.sleep(15)
        before = plane.apiserver_heap_live_mib(), api.rss_mib()
        if way == "cnidra":
            served = await ServedNetworks(client, plane.work / "conf").served()
            cni_bin = plugin_dir(plane.work)
            networks = StaticNetworks(served)
            await publish_cnidra(client, sorted(uids), cni_bin, networks, 240, args.seed)
        else:
            await publish_example(client, uids)
        await asyncio.sleep(15)
        after = plane.apiserver_heap_live_mib(), api.rss_mib()
    finally:
        await client.close()
    return {
        "heap_live_mib_nodes": round(before[0], 1),
        "heap_live_mib_fleet": round(after[0], 1),
        "heap_live_kib_per_node": round((after[0] - before[0]) * 1024 / args.nodes, 1),
        "rss_mib_nodes": round(before[1], 1),
        "rss_mib_fleet": round(after[1], 1),
    }


def memory_only(args: argparse.Namespace, bins: Bins) -> dict[str, Any]:
    out: dict[str, Any] = {"nodes": args.nodes}
    for way in ("cnidra", "dra_example"):
        plane = ControlPlane(bins, args.keep_logs / way if args.keep_logs else None)
        try:
            plane.start()
            out[way] = asyncio.run(fleet_memory(args, plane, way))
            say(f"{way}: {out[way]}")
        finally:
            plane.stop()
    return out


def report(detail: Mapping[str, Any]) -> str:
    c, e, idle = detail["cnidra"], detail.get("dra_example", {}), detail["idle"]
    s = detail["schedule"]
    lines = [
        f"the pool's blocks LIST a node reads each resync: {detail['pool_blocks_list_bytes']} B",
        f"nodes {detail['nodes']}: cnidra {c['slices']} slices, {c['devices_per_node']} devices "
        f"a node, {c['slice_bytes_per_node']} B a node in etcd (JSON "
        f"{c['slice_json_bytes_per_node']} B); dra-example {e.get('slice_bytes_per_node')} B "
        f"(JSON {e.get('slice_json_bytes_per_node')} B)",
        f"at rest ({idle['sample_nodes']} nodes, {idle['seconds']} s): "
        f"{idle['requests_per_node_per_min']} requests a node a minute "
        f"{idle['by_kind_per_node_per_min']}; watches held {idle['watches_held_per_node']} a "
        f"node; apiserver CPU {idle['apiserver_cpu_percent']} %",
    ]
    for way in ("cnidra", "dra_example"):
        w = s[way]
        lines.append(
            f"{way}: claim allocated p50 {w['allocated_p50_ms']} p99 {w['allocated_p99_ms']} ms, "
            f"pod bound p50 {w['bound_p50_ms']} p99 {w['bound_p99_ms']} ms, "
            f"{w['unscheduled']} unscheduled, scheduler {w['scheduler_cpu_ms_per_pod']} ms CPU "
            f"a pod; its own histograms (ms): {w['scheduler_own']}"
        )
    ahead = detail.get("claims_ahead")
    if ahead:
        lines.append(
            f"claims ahead on {ahead['node']} ({ahead['pods_on_node']} pods with claims there, "
            f"{ahead['pods_elsewhere']} elsewhere): {ahead['claims_kept']} kept; VmRSS "
            f"{ahead['vmrss_mib']} MiB (+{ahead['added_vmrss_mib']}), RssAnon "
            f"{ahead['rssanon_mib']} MiB (+{ahead['added_rssanon_mib']}); the tables hold "
            f"{ahead['held_kib']} KiB ({ahead['held_bytes_per_claim']} B a claim); at rest "
            f"{ahead['rest_requests_per_min']} requests a minute {ahead['rest_by_kind']}"
        )
    a = detail["apiserver"]
    lines.append(
        f"apiserver RSS (live heap) MiB: empty {a['rss_mib_empty']} ({a['heap_live_mib_empty']}), "
        f"nodes {a['rss_mib_nodes']} ({a['heap_live_mib_nodes']}), cnidra fleet "
        f"{a['rss_mib_cnidra_published']} ({a['heap_live_mib_cnidra_published']}), after the "
        f"sample at rest {a['rss_mib_cnidra_fleet']} ({a['heap_live_mib_cnidra_fleet']}), "
        f"example fleet {a.get('rss_mib_example_fleet')} ({a.get('heap_live_mib_example_fleet')})"
    )
    return "\n".join(lines)


def pool_accounting_only(args: argparse.Namespace) -> int:
    from bench import fleet_pools

    if args.control_plane:
        return pool_accounting_on_apiserver(args)
    result = fleet_pools.measure(args.pools, args.nodes, seed=args.seed)
    print(fleet_pools.report(result), file=sys.stderr)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    return 0


def pool_accounting_on_apiserver(args: argparse.Namespace) -> int:
    """`--pool-accounting --control-plane`: the driver's pool accounting against the fleet's
    own etcd and kube-apiserver (bench/fleet_pools_apiserver.py)."""
    from bench import fleet_pools_apiserver

    bins = Bins.locate()
    if not (bins.k8s / "kube-apiserver").exists() or not (bins.etcd / "etcd").exists():
        raise SystemExit(f"no built control plane in {bins.k8s} / {bins.etcd}: testbed/build.sh")
    plane = ControlPlane(bins, args.keep_logs)
    started = time.monotonic()
    try:
        plane.start()

        async def bounded() -> dict[str, Any]:
            async with asyncio.timeout(args.timeout):
                return await fleet_pools_apiserver.run(
                    plane, pools=args.pools, nodes=args.nodes, seed=args.seed
                )

        result = asyncio.run(bounded())
    finally:
        plane.stop()
    result["total_s"] = round(time.monotonic() - started, 1)
    print(fleet_pools_apiserver.report(result), file=sys.stderr)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    return 0


def main(argv: Sequence[str] | None = None) -> int:  # noqa: PLR0915 - flags, then one of three runs
    parser = argparse.ArgumentParser(
        prog="python -m bench.fleet", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=100, help="pods scheduled per fleet a round")
    parser.add_argument("--rate", type=float, default=10.0, help="pods created a second")
    parser.add_argument(
        "--rounds", type=int, default=2, help="of both fleets, alternating which goes first"
    )
    parser.add_argument(
        "--warmup-pods", type=int, default=10, help="scheduled, not counted, before each round"
    )
    parser.add_argument("--sample", type=int, default=50, help="nodes running the driver at rest")
    parser.add_argument("--idle-seconds", type=float, default=300.0)
    parser.add_argument(
        "--ahead-pods",
        type=int,
        default=100,
        help="pods with claims bound to the node whose claims-ahead is measured (0: not)",
    )
    parser.add_argument(
        "--ahead-elsewhere",
        type=int,
        default=3,
        help="pods with a claim bound to each other node meanwhile",
    )
    parser.add_argument("--seed", type=int, default=28)
    parser.add_argument("--timeout", type=float, default=3600.0, help="the whole run, seconds")
    parser.add_argument("--keep-logs", type=Path, help="copy the components' logs here")
    parser.add_argument(
        "--memory",
        action="store_true",
        help="only the apiserver's memory with each fleet, each on a fresh control plane",
    )
    parser.add_argument(
        "--pool-accounting",
        action="store_true",
        help="only pool accounting's cost, in-process, no control plane (bench/fleet_pools.py)",
    )
    parser.add_argument("--pools", type=int, default=100, help="with --pool-accounting")
    parser.add_argument(
        "--control-plane",
        action="store_true",
        help="with --pool-accounting: against the fleet's own etcd and kube-apiserver",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.pool_accounting:
        return pool_accounting_only(args)
    if not 1 <= args.nodes <= MAX_NODES:
        parser.error(f"--nodes: 1 to {MAX_NODES} (a block of the pool {POOL_SUBNET} each)")
    if not 0 <= args.ahead_pods <= NODE_PODS:
        parser.error(f"--ahead-pods: 0 to {NODE_PODS} (kubelet's pods a node)")
    if args.ahead_elsewhere < 0:
        parser.error("--ahead-elsewhere: 0 or more")
    if max(args.pods, args.warmup_pods) > GPUS * args.nodes:
        parser.error(f"--pods: at most {GPUS} a node ({GPUS * args.nodes} for --nodes)")

    import logging

    logging.basicConfig(level=logging.ERROR)
    bins = Bins.locate()
    if not (bins.k8s / "kube-apiserver").exists() or not (bins.etcd / "etcd").exists():
        raise SystemExit(f"no built control plane in {bins.k8s} / {bins.etcd}: testbed/build.sh")

    def stop_on_signal(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop_on_signal)
    if args.memory:
        memory = memory_only(args, bins)
        if args.json:
            print(json.dumps(finite(memory), sort_keys=True, allow_nan=False))
        return 0
    started = time.monotonic()
    plane = ControlPlane(bins, args.keep_logs)
    try:
        plane.start()

        async def bounded() -> dict[str, Any]:
            async with asyncio.timeout(args.timeout - (time.monotonic() - started)):
                return await run(args, plane)

        detail = asyncio.run(bounded())
    except BaseException:
        for proc in plane.procs.values():
            if not proc.alive():
                say(f"{proc.name} died; log tail:\n{proc.tail()}")
        raise
    finally:
        plane.stop()
    detail["timings_s"]["total"] = round(time.monotonic() - started, 1)
    print(report(detail), file=sys.stderr)
    if args.json:
        print(json.dumps(finite(detail), sort_keys=True, allow_nan=False))
        print(json.dumps(summary(detail), allow_nan=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
