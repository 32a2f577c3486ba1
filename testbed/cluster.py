#!/usr/bin/env python3
"""A real single-node Kubernetes on this machine, for cnidra's tests. Standard library only.

    testbed.py up | down | status | env | build | node2-up | node2-down

`up` builds (or reuses) the components, then starts etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, containerd (NRI on) and kubelet as processes, each
logging to <root>/logs/<name>.log, and waits until node `testbed-node` is Ready. `down` stops
exactly the processes `up` started (by pid, recorded in <root>/pids), removes the pods'
containers, unmounts everything under <root>, deletes the bridge and namespaces it made.
Everything listens on loopback only; pod addresses come from 198.18.128.0/24; nothing is
attached to the machine's real interfaces and nothing is masqueraded.

`node2-up` adds a second node, `testbed-node2`, for the tests that need two (tainted, so no
other pod lands there): its own network namespace joined to the machine's by a veth of
198.18.126.0/30 (its kubelet listens there for the apiserver), its own containerd and kubelet,
pods from 198.18.129.0/24. `node2-down` (and `down`) remove it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
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


# ----------------------------------------------------------------------------- layout


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


# ----------------------------------------------------------------------------- certificates


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _cert(name: str, subject: str, sans: Sequence[str] = (), server: bool = False) -> None:
    pki = Paths.pki
    key, csr, crt, ext = (pki / f"{name}.{s}" for s in ("key", "csr", "crt", "ext"))
    _openssl("genrsa", "-out", str(key), "2048")
    _openssl("req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr))
    usage = "serverAuth" if server else "clientAuth"
    lines = [
        "basicConstraints=CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={usage}",
    ]
    if sans:
        lines.append("subjectAltName=" + ",".join(sans))
    ext.write_text("\n".join(lines) + "\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(pki / "ca.crt"),
        "-CAkey",
        str(pki / "ca.key"),
        "-CAcreateserial",
        "-days",
        "3650",
        "-sha256",
        "-extfile",
        str(ext),
        "-out",
        str(crt),
    )
    csr.unlink()
    ext.unlink()


def make_pki() -> None:
    pki = Paths.pki
    if (pki / ".complete").exists():
        return
    shutil.rmtree(pki, ignore_errors=True)
    pki.mkdir(parents=True, mode=0o700)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(pki / "ca.key"),
        "-out",
        str(pki / "ca.crt"),
        "-days",
        "3650",
        "-subj",
        "/CN=cnidra-testbed-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
    )
    _cert(
        "apiserver",
        "/CN=kube-apiserver",
        server=True,
        sans=[
            "IP:127.0.0.1",
            f"IP:{SERVICE_IP}",
            "DNS:localhost",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
        ],
    )
    _cert(
        "kubelet-serving",
        f"/CN={NODE}",
        server=True,
        sans=["IP:127.0.0.1", f"IP:{NODE_IP}", f"DNS:{NODE}"],
    )
    _cert("admin", "/O=system:masters/CN=cnidra-testbed-admin")
    _cert("apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client")
    _cert("kubelet", f"/O=system:nodes/CN=system:node:{NODE}")
    _cert("controller-manager", "/CN=system:kube-controller-manager")
    _cert("scheduler", "/CN=system:kube-scheduler")
    _openssl("genrsa", "-out", str(pki / "sa.key"), "2048")
    _openssl("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
    (pki / ".complete").touch()


def kubeconfig(path: Path, user: str) -> None:
    pki = Paths.pki
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "testbed",
                "clusters": [
                    {
                        "name": "testbed",
                        "cluster": {
                            "server": f"https://127.0.0.1:{APISERVER_PORT}",
                            "certificate-authority": str(pki / "ca.crt"),
                        },
                    }
                ],
                "users": [
                    {
                        "name": user,
                        "user": {
                            "client-certificate": str(pki / f"{user}.crt"),
                            "client-key": str(pki / f"{user}.key"),
                        },
                    }
                ],
                "contexts": [{"name": "testbed", "context": {"cluster": "testbed", "user": user}}],
            },
            indent=2,
        )
    )
    path.chmod(0o600)


# ----------------------------------------------------------------------------- configs


PRIMARY_PLUGIN = "tb-primary"
SLOW_PLUGIN = "tb-sleepy"


def write_test_plugins(bins: Bins) -> None:
    """tb-primary: the primary network's bridge, recording every call (command, container,
    ifName, and the caller's name), so tests can prove nobody but containerd DELs it.
    tb-sleepy: ADD takes 30 s; every other command succeeds at once."""
    Paths.cni_bin.mkdir(parents=True, exist_ok=True)
    plugins = {
        PRIMARY_PLUGIN: f"""#!/bin/sh
echo "$CNI_COMMAND $CNI_CONTAINERID $CNI_IFNAME $(cat /proc/$PPID/comm)" >> {Paths.primary_calls}
exec {bins.cni_plugins / "bridge"} "$@"
""",
        SLOW_PLUGIN: """#!/bin/sh
case "$CNI_COMMAND" in
  ADD) sleep 30; exit 1 ;;
  VERSION) echo '{"cniVersion":"1.1.0","supportedVersions":["0.4.0","1.0.0","1.1.0"]}' ;;
  *) cat >/dev/null ;;
esac
""",
    }
    for name, text in plugins.items():
        path = Paths.cni_bin / name
        path.write_text(text)
        path.chmod(0o755)


def write_configs(bins: Bins) -> None:
    for d in (Paths.logs, Paths.pids, Paths.etc):
        d.mkdir(parents=True, exist_ok=True)
    for user in ("admin", "kubelet", "controller-manager", "scheduler"):
        kubeconfig(Paths.etc / f"{user}.kubeconfig", user)
    kubeconfig(Paths.admin_kubeconfig, "admin")
    write_test_plugins(bins)
    write_node_configs(bins, NODE1)


def write_node_configs(bins: Bins, node: Node) -> None:
    """The node's primary network conf, containerd's config and kubelet's."""
    for d in (
        node.run,
        node.plugins_registry,
        node.plugins,
        node.cni_conf,
        node.cni_data,
        node.root / "nri" / "conf.d",
        node.root / "nri" / "plugins",
    ):
        d.mkdir(parents=True, exist_ok=True)
    (node.cni_conf / "10-testbed.conflist").write_text(
        json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": "testbed-primary",
                "plugins": [
                    {
                        "type": PRIMARY_PLUGIN,
                        "bridge": node.bridge,
                        "isGateway": True,
                        "ipMasq": False,
                        "hairpinMode": True,
                        "ipam": {
                            "type": "host-local",
                            "dataDir": str(node.cni_data / "networks"),
                            "ranges": [[{"subnet": node.pod_subnet, "gateway": node.pod_gateway}]],
                        },
                    },
                    {"type": "portmap", "capabilities": {"portMappings": True}, "snat": False},
                ],
            },
            indent=2,
        )
    )
    (node.etc / "containerd.toml").write_text(f"""\
version = 3
root = '{node.root}/containerd'
state = '{node.run}/containerd'

[grpc]
  address = '{node.containerd_sock}'

[ttrpc]
  address = '{node.containerd_sock}.ttrpc'

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '{PAUSE_IMAGE}'

  [plugins.'io.containerd.cri.v1.runtime']
    # this machine withholds CAP_SYS_RESOURCE, so no process may lower its oom_score_adj
    # (kubelet asks -998 for sandboxes); clamp to containerd's own score instead
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    enable_cdi = true
    cdi_spec_dirs = ['{node.cdi}']
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '{bins.runc / "runc"}'
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['{Paths.cni_bin}', '{bins.cni_plugins}']
      conf_dir = '{node.cni_conf}'

  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'

  [plugins.'io.containerd.nri.v1.nri']
    disable = false
    socket_path = '{node.nri_sock}'
    plugin_path = '{node.root}/nri/plugins'
    plugin_config_path = '{node.root}/nri/conf.d'
    plugin_registration_timeout = '5s'
    plugin_request_timeout = '2s'
""")
    pki = Paths.pki
    (node.etc / "kubelet.yaml").write_text(
        json.dumps(
            {
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "KubeletConfiguration",
                "address": node.ip,
                "port": 10250,
                "healthzBindAddress": "127.0.0.1",
                "readOnlyPort": 0,
                "authentication": {
                    "x509": {"clientCAFile": str(pki / "ca.crt")},
                    "webhook": {"enabled": True},
                    "anonymous": {"enabled": False},
                },
                "authorization": {"mode": "Webhook"},
                "tlsCertFile": str(pki / f"kubelet-serving{node.suffix}.crt"),
                "tlsPrivateKeyFile": str(pki / f"kubelet-serving{node.suffix}.key"),
                "cgroupDriver": "cgroupfs",
                "cgroupRoot": node.cgroup_root,
                # this machine has cgroup v1, which kubelet refuses from 1.35 on unless told so
                "failCgroupV1": False,
                "failSwapOn": False,
                "containerRuntimeEndpoint": f"unix://{node.containerd_sock}",
                "podLogsDir": str(node.root / "var" / "log" / "pods"),
                "volumePluginDir": str(node.root / "volume-plugins"),
                "staticPodPath": "",
                "evictionHard": {
                    "memory.available": "100Mi",
                    "nodefs.available": "1%",
                    "imagefs.available": "1%",
                },
                "imageGCHighThresholdPercent": 100,
                "imageGCLowThresholdPercent": 99,
                "featureGates": GATES,
                "serializeImagePulls": False,
                "maxPods": 250,
                "registerNode": True,
                "registerWithTaints": [SECOND_NODE_TAINT] if node != NODE1 else [],
                "resolvConf": "/etc/resolv.conf",
                "syncFrequency": "10s",
                "fileCheckFrequency": "10s",
                "nodeStatusUpdateFrequency": "5s",
            },
            indent=2,
        )
    )


# ----------------------------------------------------------------------------- processes


def _pidfile(name: str) -> Path:
    return Paths.pids / f"{name}.pid"


def running(name: str) -> int | None:
    try:
        pid = int(_pidfile(name).read_text())
    except (FileNotFoundError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    stat = Path(f"/proc/{pid}/stat").read_text().split()
    return None if stat[2] == "Z" else pid


def start(name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> int:
    pid = running(name)
    if pid:
        return pid
    logfile = open(Paths.logs / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        list(argv),
        stdout=logfile,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
        start_new_session=True,
        cwd=ROOT,
    )
    logfile.close()
    _pidfile(name).write_text(str(proc.pid))
    log(f"started {name} (pid {proc.pid}), log {Paths.logs / (name + '.log')}")
    return proc.pid


def stop(name: str, grace: float = 10.0) -> None:
    pid = running(name)
    if pid is None:
        _pidfile(name).unlink(missing_ok=True)
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and running(name):
        time.sleep(0.1)
    if running(name):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    _pidfile(name).unlink(missing_ok=True)
    log(f"stopped {name} (pid {pid})")


def wait_for(what: str, check: object, timeout: float, name: str | None = None) -> None:
    deadline = time.monotonic() + timeout
    assert callable(check)
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():
                return
        if name and not running(name):
            tail = (Paths.logs / f"{name}.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{name} exited while waiting for {what}; log tail:\n{tail}")
        time.sleep(0.25)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class KubectlError(RuntimeError):
    pass


def kubectl(
    bins: Bins, *args: str, check: bool = True, timeout: float = 60, input_: str | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(bins.k8s / "kubectl"), "--kubeconfig", str(Paths.admin_kubeconfig), *args],
        check=False,
        text=True,
        capture_output=True,
        timeout=timeout,
        input=input_,
    )
    if check and proc.returncode != 0:
        raise KubectlError(
            f"kubectl {' '.join(args)} exited {proc.returncode}: "
            f"{proc.stderr.strip() or proc.stdout.strip()}"
        )
    return proc


def crictl(
    bins: Bins, *args: str, check: bool = True, node: Node = NODE1
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(bins.crictl / "crictl"),
            "--runtime-endpoint",
            f"unix://{node.containerd_sock}",
            "--image-endpoint",
            f"unix://{node.containerd_sock}",
            "--timeout",
            "20s",
            *args,
        ],
        check=check,
        text=True,
        capture_output=True,
        timeout=60,
    )


# ----------------------------------------------------------------------------- components


def start_etcd(bins: Bins) -> None:
    start(
        "etcd",
        [
            str(bins.etcd / "etcd"),
            "--name",
            "testbed",
            "--data-dir",
            str(ROOT / "etcd"),
            "--listen-client-urls",
            f"http://{ETCD_CLIENT}",
            "--advertise-client-urls",
            f"http://{ETCD_CLIENT}",
            "--listen-peer-urls",
            f"http://{ETCD_PEER}",
            "--initial-advertise-peer-urls",
            f"http://{ETCD_PEER}",
            "--initial-cluster",
            f"testbed=http://{ETCD_PEER}",
            "--unsafe-no-fsync",
            "--quota-backend-bytes",
            str(4 << 30),
            "--log-level",
            "warn",
        ],
    )
    wait_for("etcd", lambda: port_open(int(ETCD_CLIENT.split(":")[1])), 60, "etcd")


def start_apiserver(bins: Bins, gates: Mapping[str, bool] | None = None) -> None:
    """`gates`: feature gates to set besides (or instead of) GATES, as an older release has them
    (a test then starts it again without)."""
    pki = Paths.pki
    feature_gates = ",".join(f"{k}={str(v).lower()}" for k, v in {**GATES, **(gates or {})}.items())
    start(
        "kube-apiserver",
        [
            str(bins.k8s / "kube-apiserver"),
            f"--etcd-servers=http://{ETCD_CLIENT}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={APISERVER_PORT}",
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
            "--profiling=false",
            "--v=1",
        ],
    )
    wait_for(
        "kube-apiserver /readyz",
        lambda: kubectl(bins, "get", "--raw", "/readyz", timeout=5).stdout.strip() == "ok",
        120,
        "kube-apiserver",
    )


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
            "--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-node-route-controller",
            f"--feature-gates={FEATURE_GATES}",
            "--v=1",
        ],
    )
    start(
        "kube-scheduler",
        [
            str(bins.k8s / "kube-scheduler"),
            f"--kubeconfig={Paths.etc / 'scheduler.kubeconfig'}",
            f"--authentication-kubeconfig={Paths.etc / 'scheduler.kubeconfig'}",
            f"--authorization-kubeconfig={Paths.etc / 'scheduler.kubeconfig'}",
            "--bind-address=127.0.0.1",
            "--leader-elect=false",
            f"--feature-gates={FEATURE_GATES}",
            "--v=1",
        ],
    )


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


def start_containerd(bins: Bins, node: Node = NODE1) -> None:
    share_netns_dir(node)
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


def _node_ready(bins: Bins, name: str = NODE) -> bool:
    out = kubectl(bins, "get", "node", name, "-o", "json", check=False, timeout=10)
    if out.returncode != 0:
        return False
    conditions = json.loads(out.stdout)["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "containerd",
    "kubelet",
)


# ----------------------------------------------------------------------------- commands


def build() -> Bins:
    subprocess.run([HERE / "build.sh"], check=True)
    return Bins.locate()


def up() -> None:
    started = time.monotonic()
    bins = build()
    for port in (APISERVER_PORT, 23790):
        if port_open(port) and not running("kube-apiserver"):
            raise SystemExit(f"port {port} on 127.0.0.1 is in use by something else")
    ROOT.mkdir(parents=True, exist_ok=True)
    make_pki()
    write_configs(bins)
    start_etcd(bins)
    start_apiserver(bins)
    start_controllers(bins)
    start_containerd(bins)
    start_kubelet(bins)
    wait_for(
        "the default ServiceAccount (controller-manager working)",
        lambda: (
            kubectl(
                bins, "get", "serviceaccount", "default", "-n", "default", check=False, timeout=10
            ).returncode
            == 0
        ),
        120,
        "kube-controller-manager",
    )
    log(f"up in {time.monotonic() - started:.0f}s; KUBECONFIG={Paths.admin_kubeconfig}")


def _our_shims(node: Node = NODE1) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if (
                argv
                and argv[0].endswith(b"containerd-shim-runc-v2")
                and str(node.containerd_sock).encode() in b" ".join(argv)
            ):
                pids.append(int(proc.name))
    return pids


def _mounts_under_root(under: Path = ROOT) -> list[str]:
    out = Path("/proc/self/mountinfo").read_text().splitlines()
    targets = [line.split()[4] for line in out]
    root = str(under)
    return sorted(
        {t for t in targets if t == root or t.startswith(root + "/")}, key=len, reverse=True
    )


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


def node_certs(node: Node) -> None:
    """The kubelet's serving certificate (for the apiserver's calls: exec, logs) and its
    client certificate as system:node:<name>, made once."""
    if not (Paths.pki / f"{node.kubelet_user}.crt").exists():
        _cert(
            f"kubelet-serving{node.suffix}",
            f"/CN={node.name}",
            server=True,
            sans=["IP:127.0.0.1", f"IP:{node.ip}", f"DNS:{node.name}"],
        )
        _cert(node.kubelet_user, f"/O=system:nodes/CN=system:node:{node.name}")
    kubeconfig(Paths.etc / f"{node.kubelet_user}.kubeconfig", node.kubelet_user)


def cgroup_roots(node: Node) -> list[Path]:
    """The node's cgroup root in every hierarchy (cgroup v1: one per controller)."""
    base = Path("/sys/fs/cgroup")
    if (base / "cgroup.controllers").exists():
        return [base / node.cgroup_root.strip("/")]
    hierarchies = [d for d in base.iterdir() if d.is_dir() and not d.is_symlink()]
    return [d / node.cgroup_root.strip("/") for d in hierarchies]


def make_cgroup_roots(node: Node) -> None:
    for path in cgroup_roots(node):
        path.mkdir(exist_ok=True)
        if path.parent.name == "cpuset":  # an empty cpuset takes no task
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if not (path / knob).read_text().strip():
                    (path / knob).write_text((path.parent / knob).read_text())


def remove_cgroup_roots(node: Node) -> None:
    for root in cgroup_roots(node):
        if not root.exists():
            continue
        for path in sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if path.is_dir():
                with contextlib.suppress(OSError):
                    path.rmdir()
        with contextlib.suppress(OSError):
            root.rmdir()


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


def down() -> None:
    bins = Bins.locate()
    node2_down(bins)
    if running("containerd") and Paths.containerd_sock.exists():
        crictl(bins, "rmp", "--all", "--force", check=False)
    for name in reversed(COMPONENTS):
        stop(name)
    for pid in _our_shims():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(0.3)
    for target in _mounts_under_root():
        subprocess.run(["umount", "-l", target], check=False, capture_output=True)
    subprocess.run(["ip", "link", "del", BRIDGE], check=False, capture_output=True)
    log("down: processes stopped, mounts removed, bridge deleted")
    # state that must not survive: runtime state, pod data, CNI allocations; PKI and images stay
    for d in (Paths.run, ROOT / "var", ROOT / "etcd", Paths.cni_data):
        shutil.rmtree(d, ignore_errors=True)


def status() -> int:
    bad = 0
    for name in COMPONENTS:
        pid = running(name)
        print(f"{name:26} {'running pid ' + str(pid) if pid else 'stopped'}")
        bad += pid is None
    return 1 if bad else 0


def env_lines() -> list[str]:
    bins = Bins.locate()
    path = f"{bins.k8s}:{bins.crictl}:{bins.cnitool.parent}:{bins.containerd}:$PATH"
    return [
        f"export KUBECONFIG={Paths.admin_kubeconfig}",
        f"export PATH={path}",
        f"export CONTAINER_RUNTIME_ENDPOINT=unix://{Paths.containerd_sock}",
        f"export IMAGE_SERVICE_ENDPOINT=unix://{Paths.containerd_sock}",
        f"export CNIDRA_KUBECONFIG={Paths.admin_kubeconfig}",
        f"export CNIDRA_NODE_NAME={NODE}",
        f"export CNIDRA_PLUGINS_REGISTRY_DIR={Paths.plugins_registry}",
        f"export CNIDRA_PLUGINS_DIR={Paths.plugins}",
        f"export CNIDRA_NRI_SOCKET={Paths.nri_sock}",
        f"export CNIDRA_CDI_DIR={Paths.cdi}",
        f"export CNIDRA_CNI_PATH={Paths.cni_bin}:{bins.cni_plugins}",
        f"export TESTBED_IMAGE={TEST_IMAGE}",
        f"export TESTBED_ROOT={ROOT}",
    ]


def node_env(node: Node) -> dict[str, str]:
    """The driver's settings that name the node's own kubelet, runtime and CDI directory."""
    return {
        "CNIDRA_NODE_NAME": node.name,
        "CNIDRA_PLUGINS_REGISTRY_DIR": str(node.plugins_registry),
        "CNIDRA_PLUGINS_DIR": str(node.plugins),
        "CNIDRA_NRI_SOCKET": str(node.nri_sock),
        "CNIDRA_CDI_DIR": str(node.cdi),
    }


def env_dict() -> dict[str, str]:
    """The `env` exports as a dict for Python callers, with $PATH expanded as a shell would."""
    pairs = (line.removeprefix("export ").split("=", 1) for line in env_lines())
    return {k: v.replace("$PATH", os.environ.get("PATH", "")) for k, v in pairs}


@contextlib.contextmanager
def session() -> Iterator[Bins]:
    """For pytest: bring the test bed up (reusing a running one), always bring it down after."""
    was_running = all(running(n) for n in COMPONENTS)
    if not was_running:
        up()
    try:
        yield Bins.locate()
    finally:
        if not was_running and os.environ.get("CNIDRA_TESTBED_KEEP") != "1":
            down()


def main(argv: Sequence[str]) -> int:
    command = argv[1] if len(argv) > 1 else "status"
    if command == "up":
        up()
    elif command == "down":
        down()
    elif command == "status":
        return status()
    elif command == "env":
        print("\n".join(env_lines()))
    elif command == "build":
        build()
    elif command == "node2-up":
        node2_up(Bins.locate())
    elif command == "node2-down":
        node2_down(Bins.locate())
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
