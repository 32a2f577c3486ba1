"""Each component brought up (etcd, kube-apiserver, controllers, containerd, kubelet), the
second node, and a node's reboot."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from testbed.configs import write_node_configs
from testbed.layout import (
    APISERVER_PORT,
    ETCD_CLIENT,
    ETCD_PEER,
    FEATURE_GATES,
    GATES,
    HERE,
    NODE,
    NODE1,
    NODE2,
    NODE2_HOST_IP,
    NODE2_UPLINK,
    PAUSE_IMAGE,
    ROOT,
    RUNTIME_CONFIG,
    SERVICE_CIDR,
    TEST_IMAGE,
    Bins,
    Node,
    Paths,
    log,
)
from testbed.pki import node_certs
from testbed.processes import (
    _mounts_under_root,
    _our_shims,
    cgroup_roots,
    crictl,
    kubectl,
    make_cgroup_roots,
    port_open,
    remove_cgroup_roots,
    running,
    start,
    stop,
    wait_for,
)


def etcd_argv(
    bins: Bins,
    data_dir: Path | None = None,
    client: str = ETCD_CLIENT,
    peer: str = ETCD_PEER,
    name: str = "testbed",
) -> list[str]:
    """etcd's command line: the test bed's, or (bench.fleet) another data dir and ports."""
    return [
        str(bins.etcd / "etcd"),
        "--name",
        name,
        "--data-dir",
        str(data_dir or ROOT / "etcd"),
        "--listen-client-urls",
        f"http://{client}",
        "--advertise-client-urls",
        f"http://{client}",
        "--listen-peer-urls",
        f"http://{peer}",
        "--initial-advertise-peer-urls",
        f"http://{peer}",
        "--initial-cluster",
        f"{name}=http://{peer}",
        "--unsafe-no-fsync",
        "--quota-backend-bytes",
        str(4 << 30),
        "--log-level",
        "warn",
    ]


def start_etcd(bins: Bins) -> None:
    start("etcd", etcd_argv(bins))
    wait_for("etcd", lambda: port_open(int(ETCD_CLIENT.split(":")[1])), 60, "etcd")


def apiserver_argv(
    bins: Bins,
    gates: Mapping[str, bool] | None = None,
    pki: Path | None = None,
    etcd: str = ETCD_CLIENT,
    port: int = APISERVER_PORT,
) -> list[str]:
    """kube-apiserver's command line: the test bed's, or (bench.fleet) another PKI, etcd and
    port. `gates`: feature gates to set besides (or instead of) GATES."""
    pki = pki or Paths.pki
    feature_gates = ",".join(f"{k}={str(v).lower()}" for k, v in {**GATES, **(gates or {})}.items())
    return [
        str(bins.k8s / "kube-apiserver"),
        f"--etcd-servers=http://{etcd}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        f"--kubelet-certificate-authority={pki / 'ca.crt'}",
        "--kubelet-preferred-address-types=InternalIP,Hostname",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        "--authorization-mode=Node,RBAC",
        "--allow-privileged=true",
        f"--feature-gates={feature_gates}",
        f"--runtime-config={RUNTIME_CONFIG}",
        "--endpoint-reconciler-type=none",
        # webhooks reached at their Service's endpoints, not its cluster IP: the test bed runs
        # no kube-proxy (the chart's webhook, in-cluster, under `make test-full`)
        "--enable-aggregator-routing=true",
        "--profiling=false",
        "--v=1",
    ]


# The peers the benchmarks run beside cnidra (Multus, dra-example-driver) run as ServiceAccounts
# of this namespace, and the apiserver's audit log records their requests and no one else's:
# bench.pod_ready counts them from it (a peer's own client keeps no count it shows).
PEERS_NAMESPACE = "cnidra-peers"
AUDIT_LOG = Paths.logs / "audit-peers.log"
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    # one line a request, when it is received (a watch too, though it never completes)
    "omitStages": ["ResponseStarted", "ResponseComplete", "Panic"],
    "rules": [
        {"level": "Metadata", "userGroups": [f"system:serviceaccounts:{PEERS_NAMESPACE}"]},
        {"level": "None"},
    ],
}


def audit_argv() -> list[str]:
    """The test bed's apiserver's audit flags (its policy written): the peers' requests only."""
    policy = Paths.etc / "audit-policy.json"
    policy.write_text(json.dumps(AUDIT_POLICY))
    return [
        f"--audit-policy-file={policy}",
        f"--audit-log-path={AUDIT_LOG}",
        "--audit-log-format=json",
        "--audit-log-maxsize=200",
        "--audit-log-maxbackup=1",
    ]


def start_apiserver(bins: Bins, gates: Mapping[str, bool] | None = None) -> None:
    """`gates`: feature gates to set besides (or instead of) GATES, as an older release has them
    (a test then starts it again without). Started again under running controllers (a test
    that stopped it), the controller-manager and the scheduler are restarted once it is ready,
    as a control-plane upgrade restarts them: their informers were refused while it was down,
    and with 403s while its authorizer's caches filled, and client-go's reflectors back off up
    to 30 s on such failures (measured: a new namespace's default ServiceAccount came 26 s
    after a restart, 2 s with this)."""
    start("kube-apiserver", [*apiserver_argv(bins, gates), *audit_argv()])
    wait_for(
        "kube-apiserver /readyz",
        lambda: kubectl(bins, "get", "--raw", "/readyz", timeout=5).stdout.strip() == "ok",
        120,
        "kube-apiserver",
    )
    if running("kube-controller-manager") or running("kube-scheduler"):
        stop("kube-controller-manager")
        stop("kube-scheduler")
        start_controllers(bins)


def start_controllers(bins: Bins) -> None:
    pki = Paths.pki
    start(
        "kube-controller-manager",
        [
            str(bins.k8s / "kube-controller-manager"),
            f"--kubeconfig={Paths.etc / 'controller-manager.kubeconfig'}",
            f"--authentication-kubeconfig={Paths.etc / 'controller-manager.kubeconfig'}",
            f"--authorization-kubeconfig={Paths.etc / 'controller-manager.kubeconfig'}",
            "--bind-address=127.0.0.1",
            "--leader-elect=false",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            "--use-service-account-credentials=true",
            # the cloud controllers are named (to be turned off) until 1.36; 1.37 knows them not
            "--controllers=*,-nodeipam"
            + (
                ",-cloud-node-lifecycle,-service-lb-controller,-node-route-controller"
                if bins.k8s_minor < 37
                else ""
            ),
            f"--feature-gates={FEATURE_GATES}",
            "--v=1",
        ],
    )
    start("kube-scheduler", scheduler_argv(bins))


def scheduler_argv(bins: Bins, kubeconfig: Path | None = None) -> list[str]:
    """kube-scheduler's command line: the test bed's, or (bench.fleet) another kubeconfig."""
    kubeconfig = kubeconfig or Paths.etc / "scheduler.kubeconfig"
    return [
        str(bins.k8s / "kube-scheduler"),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        "--leader-elect=false",
        f"--feature-gates={FEATURE_GATES}",
        "--v=1",
    ]


def share_netns_dir(node: Node) -> None:
    """Pods' network namespaces as a shared mount, as on a systemd node: a DaemonSet mounting
    the directory with HostToContainer propagation (cnidra's) needs it (this sandbox's / is
    a private mount)."""
    netns = node.netns_dir
    netns.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["findmnt", "-n", "-o", "PROPAGATION", str(netns)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    if not mounted:
        subprocess.run(["mount", "--bind", str(netns), str(netns)], check=True)
    if mounted != "shared":
        subprocess.run(["mount", "--make-rshared", str(netns)], check=True)


def cdi_on_tmpfs(node: Node) -> None:
    """The node's CDI directory on a tmpfs, as /var/run/cdi is on a node: the specs and the
    device metadata files beside them (cnidra.status.metadata) are a boot's, and cost no disk
    write (a file made on this machine's disk takes about 1 ms, on a tmpfs 12 us). Mounted
    before containerd watches it; `down` unmounts it with the node's other mounts."""
    node.cdi.mkdir(parents=True, exist_ok=True)
    fstype = subprocess.run(
        ["findmnt", "-n", "-o", "FSTYPE", "--mountpoint", str(node.cdi)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    if fstype != "tmpfs":
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64m,mode=0755", "tmpfs", str(node.cdi)],
            check=True,
        )


def start_containerd(bins: Bins, node: Node = NODE1) -> None:
    share_netns_dir(node)
    cdi_on_tmpfs(node)
    path = f"{bins.containerd}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
    name = node.process("containerd")
    start(
        name,
        node.inside(
            [str(bins.containerd / "containerd"), "--config", str(node.etc / "containerd.toml")]
        ),
        env={"PATH": path},
    )
    wait_for(f"{name} CRI", lambda: crictl(bins, "info", node=node).returncode == 0, 60, name)
    import_images(bins, node)


def import_images(bins: Bins, node: Node = NODE1) -> None:
    images = ROOT / "images"
    images.mkdir(exist_ok=True)
    listed = crictl(bins, "images", check=False, node=node).stdout
    for ref, entrypoint in (
        (
            PAUSE_IMAGE,
            ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while true; do sleep 3600 & wait $!; done"],
        ),
        (TEST_IMAGE, ["/bin/sh"]),
    ):
        repo, tag = ref.rsplit(":", 1)
        if any(line.split()[:2] == [repo, tag] for line in listed.splitlines()):
            continue
        archive = images / (ref.replace("/", "_").replace(":", "_") + ".tar")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "testbed.mkimage",
                str(archive),
                ref,
                "--entrypoint",
                json.dumps(entrypoint),
            ],
            check=True,
        )
        subprocess.run(
            [
                str(bins.containerd / "ctr"),
                "--address",
                str(node.containerd_sock),
                "-n",
                "k8s.io",
                "images",
                "import",
                "--no-unpack=false",
                str(archive),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        log(f"imported {ref} into {node.process('containerd')}")


def make_bridge(node: Node) -> None:
    """The primary network's bridge, made before kubelet; host-only. The first node's address
    on it is the node IP (kubelet refuses a loopback one)."""
    ip = node.inside(["ip"])
    shown = subprocess.run([*ip, "link", "show", node.bridge], capture_output=True, check=False)
    if shown.returncode != 0:
        subprocess.run([*ip, "link", "add", node.bridge, "type", "bridge"], check=True)
    prefix = node.pod_subnet.split("/")[1]
    subprocess.run(
        [*ip, "addr", "replace", f"{node.pod_gateway}/{prefix}", "dev", node.bridge], check=True
    )
    subprocess.run([*ip, "link", "set", node.bridge, "up"], check=True)


def start_kubelet(bins: Bins, node: Node = NODE1) -> None:
    make_bridge(node)
    name = node.process("kubelet")
    start(
        name,
        node.inside(
            [
                str(bins.k8s / "kubelet"),
                f"--config={node.etc / 'kubelet.yaml'}",
                f"--kubeconfig={Paths.etc / f'{node.kubelet_user}.kubeconfig'}",
                f"--root-dir={node.kubelet_dir}",
                f"--hostname-override={node.name}",
                f"--node-ip={node.ip}",
                "--v=2",
            ]
        ),
        env={"PATH": f"{bins.containerd}:{os.environ.get('PATH', '')}"},
    )
    wait_for(f"node {node.name} Ready", lambda: _node_ready(bins, node.name), 180, name)


def restart_kubelets(bins: Bins) -> list[str]:
    """Each running kubelet stopped and started again (its pods and containers stay), as an
    operator does after a control-plane restart: client-go's reflectors back off up to 30 s
    (twice that with jitter) after the apiserver refused them, so a kubelet left alone sees
    pods bound to it that much later (measured: the plain pod after the test without optional
    features, which restarts the apiserver twice, ran in 11.9 s run alone and 48.8 s in `make
    test`, 19 s of it before kubelet saw the pod; 2.1 s after a restart of kubelet, which cost
    under a second). Returns the nodes restarted."""
    restarted = []
    for node in (NODE1, NODE2):
        if running(node.process("kubelet")):
            stop(node.process("kubelet"))
            start_kubelet(bins, node)
            restarted.append(node.name)
    return restarted


def _node_ready(bins: Bins, name: str = NODE) -> bool:
    out = kubectl(bins, "get", "node", name, "-o", "json", check=False, timeout=10)
    if out.returncode != 0:
        return False
    conditions = json.loads(out.stdout)["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def reboot(bins: Bins, node: Node = NODE1, between: Callable[[], None] | None = None) -> None:
    """The node's reboot as the software on it sees it: kubelet, containerd, every shim and every
    process of every pod gone, with the runtime's state (a tmpfs: sandboxes' network
    namespaces, tasks) and the pods' in-memory volumes; what is on disk stays (kubelet's and
    containerd's roots, CNI data, /var/lib/cnidra). `between` runs while the node is down.
    The apiserver, etcd and the controllers stay up: they are other machines."""
    stop(node.process("kubelet"))
    stop(node.process("containerd"))
    for pid in _our_shims(node):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for _ in range(20):  # every process of every pod (the cgroups the kubelet made)
        pids = [
            int(pid)
            for root in cgroup_roots(node)
            for procs in (root / "kubepods").rglob("cgroup.procs")
            for pid in procs.read_text().split()
        ]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    time.sleep(0.3)
    for under in (node.run, node.kubelet_dir / "pods"):
        for target in _mounts_under_root(under):
            subprocess.run(["umount", "-l", target], check=False, capture_output=True)
    shutil.rmtree(node.run / "containerd", ignore_errors=True)
    log(f"{node.name} rebooted: processes, sandboxes and network namespaces gone")
    if between is not None:
        between()
    start_containerd(bins, node)
    start_kubelet(bins, node)


def make_uplink(node: Node) -> None:
    """The node's network namespace and the veth that joins it to the machine's: the
    apiserver reaches the node's kubelet at node.ip; nothing else is routed."""
    assert node.netns is not None
    if not Path(f"/run/netns/{node.netns}").exists():
        subprocess.run(["ip", "netns", "add", node.netns], check=True)
    outside, inside = NODE2_UPLINK
    shown = subprocess.run(["ip", "link", "show", outside], check=False, capture_output=True)
    if shown.returncode != 0:
        subprocess.run(
            ["ip", "link", "add", outside, "type", "veth", "peer", "name", inside,
             "netns", node.netns],
            check=True,
        )  # fmt: skip
    subprocess.run(["ip", "addr", "replace", f"{NODE2_HOST_IP}/30", "dev", outside], check=True)
    subprocess.run(["ip", "link", "set", outside, "up"], check=True)
    ip = ["ip", "-n", node.netns]
    subprocess.run([*ip, "addr", "replace", f"{node.ip}/30", "dev", inside], check=True)
    subprocess.run([*ip, "link", "set", inside, "up"], check=True)
    subprocess.run([*ip, "link", "set", "lo", "up"], check=True)


def node2_up(bins: Bins, node: Node = NODE2) -> None:
    """A second node on this machine, beside a running first one: its own network namespace,
    containerd and kubelet, the same apiserver (reached on the namespace's loopback through
    forward.py). Tainted with SECOND_NODE_TAINT."""
    if running(node.process("kubelet")) and _node_ready(bins, node.name):
        return
    started = time.monotonic()
    node_certs(node)
    write_node_configs(bins, node)
    make_uplink(node)
    make_cgroup_roots(node)
    start(
        node.process("apiserver-forward"),
        [sys.executable, str(HERE / "forward.py"), str(node.netns), str(APISERVER_PORT)],
    )
    start_containerd(bins, node)
    start_kubelet(bins, node)
    log(f"{node.name} up in {time.monotonic() - started:.0f}s")


def node2_down(bins: Bins, node: Node = NODE2) -> None:
    """Everything node2_up made, gone; the Node object too."""
    if running(node.process("containerd")) and node.containerd_sock.exists():
        crictl(bins, "rmp", "--all", "--force", check=False, node=node)
    for component in ("kubelet", "containerd", "apiserver-forward"):
        stop(node.process(component))
    for pid in _our_shims(node):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for target in _mounts_under_root(node.root):
        subprocess.run(["umount", "-l", target], check=False, capture_output=True)
    if node.netns and Path(f"/run/netns/{node.netns}").exists():
        subprocess.run(["ip", "netns", "del", node.netns], check=False, capture_output=True)
    subprocess.run(["ip", "link", "del", NODE2_UPLINK[0]], check=False, capture_output=True)
    remove_cgroup_roots(node)
    if running("kube-apiserver"):
        kubectl(bins, "delete", "node", node.name, "--ignore-not-found", check=False)
    shutil.rmtree(node.root, ignore_errors=True)
