"""The test bed's layout: its root, ports, address ranges, images and feature gates; the
binaries it runs (Bins); its nodes and their directories (Node, Paths). No processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

HACK = REPO / "hack"

HERE = Path(__file__).resolve().parent

ROOT = Path(os.environ.get("CNIDRA_TESTBED_ROOT", "/var/lib/cnidra-testbed"))

WORK = REPO / ".testbed"  # in the work tree, ignored by git: the admin kubeconfig

NODE = "testbed-node"

ETCD_CLIENT = "127.0.0.1:23790"

ETCD_PEER = "127.0.0.1:23800"

APISERVER_PORT = 16443

SERVICE_CIDR = "198.19.0.0/24"

SERVICE_IP = "198.19.0.1"

POD_SUBNET = "198.18.128.0/24"

POD_GATEWAY = "198.18.128.1"

NODE_IP = POD_GATEWAY  # kubelet refuses a loopback node IP; the bridge's own address serves

BRIDGE = "cnidra-tb0"

PAUSE_IMAGE = "registry.k8s.io/pause:3.10.2"

TEST_IMAGE = "cnidra.local/testbed/busybox:1"

# The DRA features cnidra uses, set explicitly although 1.36 has them on by default (beta):
# device status in ResourceClaims, consumable capacity (KEP-5075), partitionable devices, taints.
# (PrioritizedList and AdminAccess are GA in 1.36, so they are no longer gates.)
GATES = {
    "DRAResourceClaimDeviceStatus": True,
    "DRAConsumableCapacity": True,
    "DRAPartitionableDevices": True,
    "DRADeviceTaints": True,
}

FEATURE_GATES = ",".join(f"{k}={str(v).lower()}" for k, v in GATES.items())

RUNTIME_CONFIG = (
    "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true,resource.k8s.io/v1alpha3=true"
)


def log(message: str) -> None:
    print(f"[testbed {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Bins:
    k8s: Path
    etcd: Path
    containerd: Path
    crictl: Path
    runc: Path
    cni_plugins: Path
    cnitool: Path

    @classmethod
    def locate(cls) -> Bins:
        out = subprocess.run(
            [HERE / "build.sh", "paths"], check=True, text=True, capture_output=True
        ).stdout
        paths = dict(line.split("=", 1) for line in out.split())
        cni = subprocess.run(
            [HACK / "install-cni.sh", "env"], check=True, text=True, capture_output=True
        ).stdout
        cni_env = dict(line.removeprefix("export ").split("=", 1) for line in cni.splitlines())
        return cls(
            Path(paths["K8S_BIN"]),
            Path(paths["ETCD_BIN"]),
            Path(paths["CONTAINERD_BIN"]),
            Path(paths["CRICTL_BIN"]),
            Path(paths["RUNC_BIN"]),
            Path(cni_env["CNIDRA_TEST_CNI_PATH"]),
            Path(cni_env["CNIDRA_TEST_CNITOOL"]),
        )

    @property
    def k8s_minor(self) -> int:
        """The Kubernetes minor release of these binaries (their cache directory is
        kubernetes-v1.<minor>.<patch>)."""
        return int(self.k8s.name.removeprefix("kubernetes-v").split(".")[1])

    def built(self) -> bool:
        dirs = (self.k8s, self.etcd, self.containerd, self.crictl, self.runc)
        return all((d / ".complete").exists() for d in dirs)


@dataclass(frozen=True)
class Node:
    """One node: a containerd and a kubelet with their own directories under `root`, in the
    machine's network namespace or in `netns` (the second node's, reached over a veth)."""

    name: str
    root: Path
    ip: str  # kubelet's node IP: where the apiserver reaches it
    pod_subnet: str
    pod_gateway: str
    bridge: str  # the primary network's bridge, in the node's namespace
    netns: str | None = None
    cgroup_root: str = "/"
    suffix: str = ""  # of its processes' names: containerd<suffix>, kubelet<suffix>

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "var" / "lib" / "kubelet"

    @property
    def plugins_registry(self) -> Path:
        return self.kubelet_dir / "plugins_registry"

    @property
    def plugins(self) -> Path:
        return self.kubelet_dir / "plugins"

    @property
    def cni_conf(self) -> Path:
        return self.etc / "cni" / "net.d"

    @property
    def cni_data(self) -> Path:
        return self.root / "var" / "lib" / "cni"

    @property
    def containerd_sock(self) -> Path:
        return self.run / "containerd" / "containerd.sock"

    @property
    def netns_dir(self) -> Path:
        """Where containerd mounts the pods' network namespaces."""
        return self.run / "containerd" / "io.containerd.grpc.v1.cri" / "netns"

    @property
    def nri_sock(self) -> Path:
        return self.run / "nri" / "nri.sock"

    @property
    def cdi(self) -> Path:
        """CDI specs containerd reads (the driver's device metadata mounts)."""
        return self.root / "cdi"

    @property
    def kubelet_user(self) -> str:
        return f"kubelet{self.suffix}"

    def process(self, component: str) -> str:
        return f"{component}{self.suffix}"

    def inside(self, argv: Sequence[str]) -> list[str]:
        """`argv` run in the node's network namespace (only that: the mounts stay shared)."""
        if self.netns is None:
            return list(argv)
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--", *argv]


NODE1 = Node(NODE, ROOT, NODE_IP, POD_SUBNET, POD_GATEWAY, BRIDGE)

# The second node, brought up only for the tests that need it (`node2_up`): its own network
# namespace, joined to the machine's by a veth of 198.18.126.0/30; tainted, so that only pods
# that tolerate SECOND_NODE_TAINT land on it.
NODE2_NETNS = "cnidra-tb-n2"

NODE2_UPLINK = ("cnidra-n2h", "tb-uplink")  # the machine's end, the node's end

NODE2_HOST_IP = "198.18.126.1"

NODE2 = Node(
    "testbed-node2",
    ROOT / "node2",
    "198.18.126.2",
    "198.18.129.0/24",
    "198.18.129.1",
    "cnidra-tb1",
    netns=NODE2_NETNS,
    cgroup_root="/testbed-node2",
    suffix="-node2",
)

SECOND_NODE_TAINT = {"key": "cnidra.test/second-node", "value": "true", "effect": "NoSchedule"}


class Paths:
    pki = ROOT / "pki"
    logs = ROOT / "logs"
    pids = ROOT / "pids"
    etc = ROOT / "etc"
    run = NODE1.run
    kubelet_dir = NODE1.kubelet_dir
    plugins_registry = NODE1.plugins_registry
    plugins = NODE1.plugins
    cni_conf = NODE1.cni_conf
    cni_data = NODE1.cni_data
    # the test bed's own plugins, on containerd's and the driver's CNI path: the primary
    # network's recording bridge and a plugin slower than any hook budget
    cni_bin = ROOT / "cni-bin"
    primary_calls = ROOT / "logs" / "primary-cni.log"
    containerd_sock = NODE1.containerd_sock
    netns = NODE1.netns_dir  # pods' namespaces
    nri_sock = NODE1.nri_sock
    cdi = NODE1.cdi
    admin_kubeconfig = WORK / "admin.kubeconfig"
