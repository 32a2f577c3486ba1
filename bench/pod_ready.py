"""Pod creation to Ready, the same pods five ways in one run, alternating round by round (not a
test: numbers).

    python -m bench.pod_ready [--pods 50] [--rounds 3] [--ways none,cnidra] [--profile DIR]
                              [--json]

none         pods with no secondary network
dra_example  pods with a ResourceClaim served by dra-example-driver's kubelet plugin, a DRA
             driver that does nothing on the node: kubelet's and the scheduler's DRA cost alone
multus       pods with a macvlan + host-local network through Multus (thin plugin, a
             NetworkAttachmentDefinition, the pod annotation): what users run today
multus_thick the same NAD and pods through Multus thick, the deployment Multus' docs now
             recommend: multus-daemon as a host process for its turn (MultusThick: how it is
             configured and given credentials), multus-shim the runtime's CNI plugin
cnidra       the same macvlan through cnidra (a ResourceClaimTemplate), addressed by
             cnidra's cluster IPAM: prepare takes the address from a CNIIPPool of
             198.18.161.0/24 made for the run and hands the plugins the static IPAM plugin
             with it (host-local written by a claim is refused; bench/pools.py); Multus's NAD
             keeps host-local (198.18.160.0/24)

Each round runs, for each way in turn, one pod alone and then a burst of --pods at once; the
time of a pod is from the watch event that shows it created to the one that shows it Ready
(client clock, millisecond resolution). Each way's p50 and p99 are over all its rounds' bursts,
and each round's alone in its `by_round`. cnidra's time is split from its own metrics: prepare,
the RunPodSandbox hook, the plugins inside it, and the status write after it. What cnidra's
driver costs per pod, over its whole rounds (the single pod and the burst, created and deleted,
until its status queue is empty): `cpu_ms_per_pod` (its process's user + system time, from
/proc/<pid>/stat) and `apiserver_requests_per_pod` (every request its client made, from its
cnidra_apiserver_requests_total), with `apiserver_requests_per_pod_by_kind` ("verb resource":
which of them are the pods', which the slice publisher's), in the JSON's "cnidra"; the pool's
GET (kept 10 s) and a block's CREATE per 16 addresses (a LIST of the pool's blocks before the
first of a burst) are among them now. The raw CNI time is the macvlan + host-local ADD exec'd
directly.

The peers' apiserver requests per pod, counted the same way over their rounds (the single pod
and the burst, created and deleted), are in the JSON's "multus", "multus_thick" and
"dra_example" (`apiserver_requests_per_pod`, `..._by_kind`, `apiserver_user_agents`): each runs
as a ServiceAccount of the test bed's PEERS_NAMESPACE, whose requests alone the test bed's
apiserver writes to its audit log, as each was received (testbed/components.py); a peer's
requests between its turn's first pod and its last pod's deletion are its turn's.

Every way's node CPU per pod, over its rounds (`node_cpu_ms_per_pod`, beyond the `none` way's;
by part, the baseline not taken off, in `node_cpu_ms_per_pod_by_part`): containerd with the
plugins it execs and reaps (Multus thin, multus-shim, the primary network's plugin), its shims
(sampled while they live), kubelet, and the way's own daemon with the plugins it execs (cnidra's
driver, multus-daemon, dra-example-driver's plugin); not the pods' own processes. The control
plane's (apiserver, etcd, scheduler, controller-manager: other machines in a real cluster) is
beside, in `control_plane_cpu_ms_per_pod`. bench/node_cpu.py says exactly what is counted.

`--ways` runs some of the ways only (a profile of cnidra's driver beside the `none` baseline:
`--ways none,cnidra --profile DIR`, py-spy on PATH; the goals need every way). The last line
is one JSON object. `CNIDRA_ATTACH_BEHIND_SANDBOX=false` in the environment
measures the ADDs inside the sandbox hook instead.

Needs the test bed (`make test`'s cache) and the peers (hack/install-peers.sh, which `make
bench` runs): about 5 minutes per round at 50 pods on 2 cores, plus the peers' first build
(about 4 minutes). Only one driver serves each way's pods: cnidra's runs only during its turn,
multus-daemon only during its; Multus (thin, or thick's shim) is the runtime's CNI config only
during its turn.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Pod
from prometheus_client.parser import text_string_to_metric_families

from bench.driver_latency import pct, raw_cni_ms
from bench.node_cpu import CONTROL_PLANE, NODE_PARTS, Ledger, ShimLedger, Window
from bench.pools import cnidra_ipam, delete_pool, in_namespace, pool_name, pool_object
from bench.profile import profiled
from cnidra.cni import netns
from cnidra.inventory.publisher import CHECK_ROUNDS
from testbed import cluster as tb
from testbed.components import AUDIT_LOG, PEERS_NAMESPACE
from testbed.crds import NAD_CRD
from testbed.harness import ROOT, Cluster, DriverProcess

DRIVER = "cni.dra.networking.x-k8s.io"
EXAMPLE_DRIVER = "gpu.example.com"
WAYS = ("none", "dra_example", "multus", "multus_thick", "cnidra")
MULTUS_WAYS = ("multus", "multus_thick")  # the same NAD, the same pod annotation
SUBNETS = {
    "multus": "198.18.160.0/24",
    "multus_thick": "198.18.160.0/24",
    "cnidra": "198.18.161.0/24",
}


def peers() -> dict[str, str]:
    """Where hack/install-peers.sh put the peers: {"multus": path, ...}; building them first."""
    script = ROOT / "hack" / "install-peers.sh"
    subprocess.run([script], check=True)
    out = subprocess.run([script, "env"], check=True, capture_output=True, text=True).stdout
    found = dict(line.removeprefix("export ").split("=", 1) for line in out.splitlines())
    return {
        "multus": found["CNIDRA_PEER_MULTUS"],
        "multus_shim": found["CNIDRA_PEER_MULTUS_SHIM"],
        "multus_daemon": found["CNIDRA_PEER_MULTUS_DAEMON"],
        "dra_example": found["CNIDRA_PEER_DRA_EXAMPLE"],
    }


def host_local(subnet: str, data_dir: str | None = None) -> dict[str, Any]:
    """Multus's IPAM (the NAD's, which cnidra never sees)."""
    ipam: dict[str, Any] = {"type": "host-local", "ranges": [[{"subnet": subnet}]]}
    if data_dir:
        ipam["dataDir"] = data_dir
    return ipam


def macvlan(name: str, parent: str, ipam: dict[str, Any]) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": name,
        "plugins": [{"type": "macvlan", "master": parent, "mode": "bridge", "ipam": ipam}],
    }


# ----------------------------------------------------------------------------- the four ways


def pod(name: str, way: str, tag: str, namespace: str) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "c",
        "image": tb.TEST_IMAGE,
        "command": ["sleep", "3600"],
    }
    spec: dict[str, Any] = {"terminationGracePeriodSeconds": 1, "containers": [container]}
    meta: dict[str, Any] = {"name": name, "labels": {"bench": tag}}
    if way in ("dra_example", "cnidra"):
        template = way.replace("_", "-")
        spec["resourceClaims"] = [{"name": "dev", "resourceClaimTemplateName": template}]
        container["resources"] = {"claims": [{"name": "dev"}]}
    if way in MULTUS_WAYS:
        meta["annotations"] = {"k8s.v1.cni.cncf.io/networks": f"{namespace}/bench-macvlan"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def templates(parent: str, pool: str) -> list[dict[str, Any]]:
    """dra-example's template, and cnidra's: a macvlan on `parent` addressed from `pool`."""

    def template(name: str, device_class: str, config: list[dict[str, Any]]) -> dict[str, Any]:
        request: dict[str, Any] = {"name": "dev", "exactly": {"deviceClassName": device_class}}
        if device_class == "cni.networking.x-k8s.io":
            selector = f'device.attributes["{DRIVER}"].ifName == "{parent}"'
            request["exactly"]["selectors"] = [{"cel": {"expression": selector}}]
        devices: dict[str, Any] = {"requests": [request]}
        if config:
            devices["config"] = config
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": devices}},
        }

    params = {
        "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
        "kind": "CNIConfig",
        "ifName": "net1",
        "config": macvlan("bench-cnidra", parent, cnidra_ipam(pool)),
    }
    return [
        template("dra-example", EXAMPLE_DRIVER, []),
        template(
            "cnidra",
            "cni.networking.x-k8s.io",
            [{"requests": ["dev"], "opaque": {"driver": DRIVER, "parameters": params}}],
        ),
    ]


def policy_samples() -> list[dict[str, Any]]:
    """What the run sends cnidra, for tests/bench's check against the shipped policy."""
    return [
        pool_object("bench-pod-ready", SUBNETS["cnidra"], ["ready-ns"]),
        *in_namespace("ready-ns", *templates("bpr0", "bench-pod-ready")),
    ]


class ExampleDriver:
    """dra-example-driver's kubelet plugin as a process on the test bed's node: 64 fake GPUs,
    CDI specs where containerd reads them, and room to talk to the apiserver (its defaults of
    5 QPS would make it, not kubelet, the bottleneck of a 50-pod burst)."""

    def __init__(self, binary: str, log: Path, kubeconfig: Path) -> None:
        self.argv = [
            binary,
            f"--node-name={tb.NODE}",
            f"--kubeconfig={kubeconfig}",
            f"--kubelet-registrar-directory-path={tb.Paths.plugins_registry}",
            f"--kubelet-plugins-directory-path={tb.Paths.plugins}",
            f"--cdi-root={tb.Paths.cdi}",
            "--num-devices=64",
            "--kube-api-qps=100",
            "--kube-api-burst=200",
        ]
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, bed: Cluster) -> None:
        bed.apply(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": EXAMPLE_DRIVER},
                "spec": {
                    "selectors": [{"cel": {"expression": f"device.driver == '{EXAMPLE_DRIVER}'"}}]
                },
            }
        )
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT)
        bed.wait(
            "dra-example-driver's ResourceSlice",
            lambda: EXAMPLE_DRIVER in bed.kubectl("get", "resourceslices", "-o", "json").stdout,
            60,
        )

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@contextmanager
def multus_installed(binary: str, work: Path, kubeconfig: Path) -> Iterator[None]:
    """Multus thin as the runtime's CNI config (a file sorting before the test bed's primary
    conflist, which it delegates to), its binary on containerd's plugin path; `kubeconfig` its
    ServiceAccount's (Peers)."""
    primary = json.loads((tb.Paths.cni_conf / "10-testbed.conflist").read_text())
    conf = {
        "cniVersion": "1.0.0",
        "name": "multus-cni-network",
        "type": "multus",
        "kubeconfig": str(kubeconfig),
        "cniDir": str(work / "multus-cache"),
        "confDir": str(tb.Paths.cni_conf),
        "delegates": [primary],
    }
    plugin = tb.Paths.cni_bin / "multus"
    shutil.copy2(binary, plugin)
    path = tb.Paths.cni_conf / "00-bench-multus.conf"
    path.write_text(json.dumps(conf))
    time.sleep(2)  # containerd reloads its CNI config on a file change
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        time.sleep(2)
        plugin.unlink(missing_ok=True)


# in-cluster credentials, where client-go's rest.InClusterConfig reads them (fixed paths)
PRIMARY = tb.Paths.cni_conf / "10-testbed.conflist"
SERVICE_ACCOUNT_DIR = Path("/run/secrets/kubernetes.io/serviceaccount")
MARKER = ".cnidra-bench"


class MultusThick:
    """Multus thick as a host process of the test bed's node: `multus-daemon` (what Multus's
    DaemonSet runs), and `multus-shim` as the runtime's CNI config (a conf file sorting before
    the test bed's primary, which it delegates to).

    The daemon reads one config file (cmd/multus-daemon; pkg/server/types.go's
    ControllerNetConf: socketDir, logging; pkg/server/config's MultusConf: the conf it writes;
    and every key of it overrides each request's Multus config: binDir, cniDir, confDir). As
    its DaemonSet does, it runs with multusConfigFile "auto": it writes 00-multus.conf (type
    multus-shim, clusterNetwork the primary's file, daemonSocketDir) into the CNI conf dir, from
    the primary named by multusMasterCNI, and removes it when it stops. (v4.3.0's daemon given a
    file of its own instead copies it and exits at once: its main waits only on the "auto"
    config manager.) It watches the node's pods (MULTUS_NODE_NAME) and the NADs, and execs the
    delegates itself. Its only way to the apiserver outside
    perNodeCertificate (a CSR flow) is client-go's in-cluster config: KUBERNETES_SERVICE_HOST
    and _PORT, and a token and CA under /run/secrets/kubernetes.io/serviceaccount. A pod's
    service account is what it runs as on a cluster, so the run makes one (bound to
    cluster-admin) and writes its token there for the daemon's turn; the directory is refused
    if someone else's is there, and removed after. A mount namespace of its own would keep it
    off the host, but pods' network namespaces are mounts containerd makes after the daemon
    starts, and the host's mounts do not propagate (private), so the daemon would not see
    them."""

    def __init__(self, shim: str, daemon: str, work: Path, bins: tb.Bins) -> None:
        self.shim, self.daemon, self.bins = shim, daemon, bins
        self.work = work / "multus-thick"
        self.log = self.work / "daemon.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.token = ""

    def prepare(self, token: str) -> None:
        """Its ServiceAccount's token (Peers, once a run)."""
        self.work.mkdir(exist_ok=True)
        self.token = token

    @contextmanager
    def installed(self) -> Iterator[subprocess.Popen[bytes]]:
        """The daemon running and the shim the runtime's CNI config, for one turn."""
        sockets = self.work / "run"
        sockets.mkdir(exist_ok=True)
        config = self.work / "daemon-config.json"
        config.write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "socketDir": str(sockets),
                    "daemonSocketDir": str(sockets),  # the shim's, in the conf it writes
                    "multusConfigFile": "auto",
                    "multusAutoconfigDir": str(tb.Paths.cni_conf),
                    "multusMasterCNI": PRIMARY.name,
                    "cniConfigDir": str(tb.Paths.cni_conf),
                    "confDir": str(tb.Paths.cni_conf),
                    "cniDir": str(self.work / "cache"),
                    "binDir": str(self.bins.cni_plugins),
                    "logFile": str(self.work / "multus.log"),
                    "logLevel": "error",
                }
            )
        )
        installed = tb.Paths.cni_conf / "00-multus.conf"
        plugin = tb.Paths.cni_bin / "multus-shim"
        self._credentials()
        shutil.copy2(self.shim, plugin)
        env = {
            **os.environ,
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(tb.APISERVER_PORT),
            "MULTUS_NODE_NAME": tb.NODE,
            # containerd's CNI path, which the thin plugin gets from containerd
            "CNI_PATH": f"{tb.Paths.cni_bin}:{self.bins.cni_plugins}",
        }
        try:
            with open(self.log, "ab") as out:
                self.proc = subprocess.Popen(
                    [self.daemon, f"-config={config}"],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            deadline = time.monotonic() + 60
            while not ((sockets / "multus.sock").exists() and installed.exists()):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    tail = self.log.read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"multus-daemon did not start:\n{tail}")
                time.sleep(0.2)
            time.sleep(2)  # containerd reloads its CNI config on a file change
            yield self.proc
        finally:
            installed.unlink(missing_ok=True)
            time.sleep(2)
            if self.proc is not None and self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(15)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            plugin.unlink(missing_ok=True)
            self._no_credentials()

    def _credentials(self) -> None:
        top = SERVICE_ACCOUNT_DIR.parents[1]  # /run/secrets
        if top.exists() and not (top / MARKER).exists():
            raise RuntimeError(f"{top} exists and is not this benchmark's: not overwritten")
        SERVICE_ACCOUNT_DIR.mkdir(parents=True, exist_ok=True)
        (top / MARKER).touch()
        (SERVICE_ACCOUNT_DIR / "token").write_text(self.token)
        shutil.copy2(tb.Paths.pki / "ca.crt", SERVICE_ACCOUNT_DIR / "ca.crt")
        (SERVICE_ACCOUNT_DIR / "namespace").write_text("default")

    def _no_credentials(self) -> None:
        top = SERVICE_ACCOUNT_DIR.parents[1]
        if (top / MARKER).exists():
            shutil.rmtree(top, ignore_errors=True)


class Peers:
    """The peers' identities: a ServiceAccount each (Multus, thin and thick; dra-example-driver)
    in the test bed's PEERS_NAMESPACE, bound to cluster-admin, whose requests the apiserver's
    audit log records (testbed/components.py's policy: theirs only). The thin plugin and
    dra-example-driver are given a kubeconfig with its token, the thick daemon the token where
    client-go's in-cluster config reads it."""

    NAMES = ("multus", "dra-example")

    def __init__(self, work: Path) -> None:
        self.work = work
        self.tokens: dict[str, str] = {}

    def make(self, bed: Cluster) -> None:
        def active() -> bool:  # a kept test bed's last run may have left it terminating
            bed.kubectl("create", "namespace", PEERS_NAMESPACE, check=False)
            phase = bed.kubectl(
                "get", "namespace", PEERS_NAMESPACE, "-o", "jsonpath={.status.phase}", check=False
            ).stdout
            return phase == "Active"

        bed.wait(f"the namespace {PEERS_NAMESPACE}", active, 120)
        for name in self.NAMES:
            bed.kubectl("create", "serviceaccount", name, "-n", PEERS_NAMESPACE, check=False)
            bed.kubectl(
                "create", "clusterrolebinding", f"{PEERS_NAMESPACE}-{name}",
                "--clusterrole=cluster-admin", f"--serviceaccount={PEERS_NAMESPACE}:{name}",
                check=False,
            )  # fmt: skip
            self.tokens[name] = bed.kubectl(
                "create", "token", name, "-n", PEERS_NAMESPACE, "--duration=6h"
            ).stdout.strip()

    def kubeconfig(self, name: str) -> Path:
        path = self.work / f"{name}.kubeconfig"
        server = f"https://127.0.0.1:{tb.APISERVER_PORT}"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "testbed",
                    "cluster": {
                        "server": server,
                        "certificate-authority": str(tb.Paths.pki / "ca.crt"),
                    },
                }
            ],
            "users": [{"name": name, "user": {"token": self.tokens[name]}}],
            "contexts": [{"name": name, "context": {"cluster": "testbed", "user": name}}],
            "current-context": name,
        }
        path.write_text(json.dumps(config))
        path.chmod(0o600)
        return path

    def remove(self, bed: Cluster) -> None:
        for name in self.NAMES:
            bed.kubectl("delete", "clusterrolebinding", f"{PEERS_NAMESPACE}-{name}", check=False)
        bed.kubectl("delete", "namespace", PEERS_NAMESPACE, "--wait=false", check=False)


def user(peer: str) -> str:
    return f"system:serviceaccount:{PEERS_NAMESPACE}:{peer}"


def audit_kind(event: dict[str, Any]) -> str:
    """ "verb resource[/subresource]" of an audit event, as cnidra's own count names its
    requests (a server-side apply is a patch here), or the path of a non-resource request."""
    ref = event.get("objectRef")
    verb = str(event.get("verb", ""))
    if not isinstance(ref, dict):
        return f"{verb} {str(event.get('requestURI', '')).split('?')[0]}"
    sub = ref.get("subresource")
    return f"{verb} {ref.get('resource', '')}{f'/{sub}' if sub else ''}"


class AuditWindow:
    """The requests a peer made between `start()` and `end()`, by kind, from the apiserver's
    audit log (every request as it was received)."""

    def __init__(self, path: Path = AUDIT_LOG) -> None:
        self.path = path
        self.offset = 0

    @staticmethod
    def available() -> bool:
        """Whether the test bed's apiserver was started with its audit log (a test bed brought
        up by an older checkout was not)."""
        pid = tb.running("kube-apiserver")
        if pid is None:
            return False
        try:
            return b"--audit-log-path=" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False

    def start(self) -> None:
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def end(self, peer: str) -> tuple[Counter[str], set[str]]:
        kinds: Counter[str] = Counter()
        agents: set[str] = set()
        if not self.path.exists():
            return kinds, agents
        with open(self.path, "rb") as f:
            if f.seek(0, os.SEEK_END) < self.offset:  # rotated: this window's from its start
                self.offset = 0
            f.seek(self.offset)
            for line in f:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("stage") != "RequestReceived":
                    continue
                if (event.get("user") or {}).get("username") != user(peer):
                    continue
                kinds[audit_kind(event)] += 1
                agents.add(str(event.get("userAgent", "")).split(" ")[0])
        return kinds, agents


@dataclass
class PeerCost:
    """A peer's apiserver requests over its way's rounds (the single pod and the burst, created
    and deleted), by kind, and the pods they were for."""

    requests: Counter[str] = field(default_factory=Counter)
    agents: set[str] = field(default_factory=set)
    pods: int = 0

    def per_pod(self) -> dict[str, Any]:
        pods = max(self.pods, 1)
        return {
            "apiserver_requests_per_pod": round(sum(self.requests.values()) / pods, 2),
            "apiserver_requests_per_pod_by_kind": {
                kind: round(count / pods, 2) for kind, count in sorted(self.requests.items())
            },
            "apiserver_user_agents": sorted(self.agents),
        }


PEER_OF = {"multus": "multus", "multus_thick": "multus", "dra_example": "dra-example"}


# ----------------------------------------------------------------------------- measuring


class ReadyTimes:
    """A watch on the namespace's pods: when each was first seen and first seen Ready."""

    def __init__(self, client: Client, namespace: str) -> None:
        self.client = client
        self.namespace = namespace
        self.created: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        time.sleep(0.3)  # the watch is open before the first pod

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for _, obj in self.client.watch(Pod, namespace=self.namespace):
                    now = time.monotonic()
                    name = obj.metadata.name if obj.metadata else None
                    if name is None:
                        continue
                    self.created.setdefault(name, now)
                    conditions = (obj.status.conditions or []) if obj.status else []
                    if any(c.type == "Ready" and c.status == "True" for c in conditions):
                        self.ready.setdefault(name, now)
                    if self._stop.is_set():
                        return
            except Exception:  # the watch ends now and then: open it again
                time.sleep(0.1)

    def wait(self, names: list[str], timeout: float) -> list[float]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(n in self.ready for n in names):
                return [self.ready[n] - self.created[n] for n in names]
            time.sleep(0.05)
        missing = [n for n in names if n not in self.ready]
        raise RuntimeError(f"{len(missing)}/{len(names)} pods not Ready: {missing[:5]}")

    def close(self) -> None:
        self._stop.set()


def burst(
    bed: Cluster, client: Client, namespace: str, way: str, count: int, tag: str
) -> list[float]:
    names = [f"{way.replace('_', '-')}-{tag}-{i:03d}" for i in range(count)]
    watch = ReadyTimes(client, namespace)
    try:
        bed.kubectl(
            "apply", "-n", namespace, "-f", "-",
            input_="\n---\n".join(json.dumps(pod(n, way, tag, namespace)) for n in names),
            timeout=120,
        )  # fmt: skip
        times = watch.wait(names, 600)
        if way in SUBNETS:  # the network is there, from its range, in the first and last pod
            for name in (names[0], names[-1]):
                shown = bed.kubectl("exec", "-n", namespace, name, "--", "ip", "-o", "-4",
                                    "addr", "show", "net1").stdout  # fmt: skip
                prefix = SUBNETS[way].rsplit(".", 1)[0] + "."
                if prefix not in shown:
                    raise RuntimeError(f"{way}: pod {name} has no net1 from {SUBNETS[way]}")
        return times
    finally:
        watch.close()
        bed.kubectl(
            "delete", "pods", "-n", namespace, "-l", f"bench={tag}", "--timeout=180s",
            timeout=240,
        )  # fmt: skip


def metric_sums(text: str, name: str, labels: str = "") -> tuple[float, float]:
    """(sum, count) of a histogram in Prometheus text, for series whose labels contain
    `labels`."""
    total = count = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or (labels and labels not in line):
            continue
        if line.startswith(f"{name}_sum"):
            total += float(line.split()[-1])
        elif line.startswith(f"{name}_count"):
            count += float(line.split()[-1])
    return total, count


def breakdown(metrics: str, pods: int) -> dict[str, float]:
    """Where cnidra's time went, per pod (mean ms), from one driver process's metrics."""

    def per_pod(name: str, labels: str = "") -> float:
        total, _ = metric_sums(metrics, name, labels)
        return round(total * 1000 / max(pods, 1), 2)

    hooks = "cnidra_nri_hook_duration_seconds"
    return {
        "prepare_ms": per_pod("cnidra_dra_request_duration_seconds", "NodePrepareResources"),
        # inside containerd's NRI lock: the sandbox hook, and the first container's wait
        "sandbox_hook_ms": per_pod(hooks, 'hook="RunPodSandbox"'),
        "container_wait_ms": per_pod(hooks, 'hook="CreateContainer"'),
        # the ADDs, behind the sandbox (or inside its hook with --attach-in-sandbox-hook)
        "attach_ms": per_pod(hooks, 'hook="Attach"') or per_pod(hooks, 'hook="RunPodSandbox"'),
        "plugins_ms": per_pod("cnidra_cni_exec_duration_seconds", 'command="ADD"'),
        "status_lag_ms": per_pod("cnidra_status_write_lag_seconds"),
    }


REQUESTS = "cnidra_apiserver_requests"


def requests_by_kind(metrics: str) -> dict[str, float]:
    """The driver's apiserver requests so far ("verb resource" -> count, every code), from its
    /metrics text (cnidra_apiserver_requests_total)."""
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics):
        if family.name != REQUESTS:
            continue
        for sample in family.samples:
            if sample.name != f"{REQUESTS}_total":
                continue
            kind = f"{sample.labels.get('verb', '')} {sample.labels.get('resource', '')}"
            counts[kind] = counts.get(kind, 0.0) + sample.value
    return counts


@dataclass
class DriverCost:
    """What cnidra's driver spent over its rounds: CPU seconds, apiserver requests by kind,
    and the pods they were for (each created and deleted)."""

    cpu_s: float = 0.0
    requests: dict[str, float] = field(default_factory=dict)
    pods: int = 0

    def add(
        self,
        cpu_s: float,
        before: dict[str, float],
        after: dict[str, float],
        pods: int,
    ) -> None:
        """One round: the CPU seconds it took, the request counts at its start and end."""
        self.cpu_s += cpu_s
        for kind in after.keys() | before.keys():
            delta = after.get(kind, 0.0) - before.get(kind, 0.0)
            if delta:
                self.requests[kind] = self.requests.get(kind, 0.0) + delta
        self.pods += pods

    def per_pod(self) -> dict[str, Any]:
        pods = max(self.pods, 1)
        return {
            "cpu_ms_per_pod": round(self.cpu_s * 1000 / pods, 2),
            # everything the driver asked over the rounds (the slice publisher's, the IPAM
            # reconciler's too), divided by the pods; by kind: which of it is per pod
            "apiserver_requests_per_pod": round(sum(self.requests.values()) / pods, 2),
            "apiserver_requests_per_pod_by_kind": {
                kind: round(count / pods, 2) for kind, count in sorted(self.requests.items())
            },
        }


def settled(driver: DriverProcess, timeout: float = 30.0) -> None:
    """Until the driver's status queue is empty (its writes for the round's pods are in the
    round's figures), or `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and driver.health().get("statusPending", 0):
        time.sleep(0.2)


def hook_ms(log: Path, namespace: str) -> list[float]:
    pattern = rf"attached \d+ interface\(s\) to pod {re.escape(namespace)}/\S+ in ([\d.]+) ms"
    return [float(m[1]) for m in re.finditer(pattern, log.read_text(errors="replace"))]


def stats(values: list[float]) -> dict[str, float]:
    return {"p50_s": round(pct(values, 0.5), 3), "p99_s": round(pct(values, 0.99), 3)}


def raw_cni(bins: tb.Bins) -> dict[str, float]:
    """The macvlan + host-local ADD, the plugin exec'd directly (60 times, one pod): wall time
    (`p50`, `p99`) and the plugins' CPU time (`cpu_p50`, `cpu_p99`)."""
    with netns.temporary("cnidra-bench-node") as node:
        ip = ["ip", "-n", node.name]
        subprocess.run([*ip, "link", "add", "data0", "type", "veth", "peer", "name", "data0p"],
                       check=True)  # fmt: skip
        subprocess.run([*ip, "link", "set", "data0", "up"], check=True)
        with netns.entered(node):
            found = raw_cni_ms(str(bins.cni_plugins), "data0", 1, 60)
    return {k: found[k] for k in ("p50", "p99", "cpu_p50", "cpu_p99")}


def start_cnidra(bed: Cluster, state_dir: Path, parent: str) -> DriverProcess:
    """The driver with deploy/'s settings but a state root of the run's (the pods share one
    parent link, so it may carry more sub-interfaces than the default)."""
    state_dir.mkdir()
    driver = DriverProcess(bed, state_dir, extra_env={"CNIDRA_SUB_INTERFACES": "1000"})
    driver.start()
    bed.wait("cnidra's NRI plugin", lambda: driver.health().get("nriConnected"), 60)
    bed.wait(
        "cnidra's slice with the parent",
        lambda: parent in bed.kubectl("get", "resourceslices", "-o", "json").stdout,
        60,
    )
    # its start-up is not a pod's: the slice checks after kubelet registered it (a LIST each,
    # the first at once, the next two at its next publishes, at the latest two resyncs later)
    # would otherwise land in the first burst's requests
    checks = 1 + CHECK_ROUNDS  # the LIST that adopts its slices at start, then the checks
    started = time.monotonic()
    while time.monotonic() - started < 90:
        if requests_by_kind(driver.metrics()).get("list resourceslices", 0) >= checks:
            break
        time.sleep(1)
    else:
        print("cnidra's start-up slice checks did not end in 90 s", file=sys.stderr)
    return driver


# ----------------------------------------------------------------------------- the run


def main() -> None:  # noqa: PLR0915 - one linear script of measurements
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="only the JSON line")
    parser.add_argument(
        "--ways",
        default=",".join(WAYS),
        help="the ways to run, comma-separated (all by default; the goals need them all)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="record py-spy flame graphs (SVG) of cnidra's driver during its bursts here",
    )
    args = parser.parse_args()
    ways = tuple(w for w in WAYS if w in args.ways.split(","))
    if not ways or set(args.ways.split(",")) - set(WAYS):
        parser.error(f"--ways: a comma-separated subset of {', '.join(WAYS)}")
    started = time.monotonic()
    found = peers()
    samples: dict[str, list[float]] = {w: [] for w in WAYS}
    single: dict[str, list[float]] = {w: [] for w in WAYS}
    cnidra_split: list[dict[str, float]] = []
    driver_cpu: list[float] = []  # CPU seconds of cnidra's driver per burst (with its deletes)
    cost = DriverCost()  # over its whole rounds: the single pod and the burst, with deletes
    peer_cost = {way: PeerCost() for way in PEER_OF}  # the same, from the audit log
    audit = AuditWindow()
    hooks: dict[str, list[float]] = {"burst": [], "single": []}
    node_cpu, plane_cpu = Ledger(), Ledger()  # every way's, over its rounds
    lingering: dict[str, int] = {}  # the way's shims still running when its rounds ended
    parent = f"bpr{uuid.uuid4().hex[:4]}"
    pool = pool_name("pod_ready")
    with tb.session() as bins, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        bed = Cluster(bins, tb.env_dict())
        client = Client(KubeConfig.from_file(str(tb.Paths.admin_kubeconfig)))
        bed.install_cnidra_api()  # the CRDs and DeviceClasses, as the chart ships them
        bed.apply(NAD_CRD)
        bed.wait(
            "the NAD CRD",
            lambda: bed.kubectl("get", "net-attach-def", "-A", check=False).returncode == 0,
            60,
        )
        subprocess.run(["ip", "link", "add", parent, "type", "bridge"], check=True)
        subprocess.run(["ip", "link", "set", parent, "up"], check=True)
        namespace = f"bench-{uuid.uuid4().hex[:6]}"
        bed.kubectl("create", "namespace", namespace)
        bed.kubectl("label", "namespace", namespace, "cni.networking.x-k8s.io/claim-config=true")
        bed.wait(
            "the namespace's ServiceAccount",
            lambda: bed.kubectl(
                "get", "serviceaccount", "default", "-n", namespace, check=False
            ).returncode == 0,
            60,
        )  # fmt: skip
        bed.apply(pool_object(pool, SUBNETS["cnidra"], [namespace]))
        multus_ipam = host_local(SUBNETS["multus"], str(work / "hl"))
        nad_config = macvlan("bench-multus", parent, multus_ipam)
        bed.apply_in(
            namespace,
            {
                "apiVersion": "k8s.cni.cncf.io/v1",
                "kind": "NetworkAttachmentDefinition",
                "metadata": {"name": "bench-macvlan"},
                "spec": {"config": json.dumps(nad_config)},
            },
            *templates(parent, pool),
        )
        identities = Peers(work)
        identities.make(bed)
        audit_on = audit.available()
        if not audit_on:
            print(f"no audit log at {AUDIT_LOG}: the peers' requests not counted", file=sys.stderr)
        example = ExampleDriver(
            found["dra_example"], work / "dra-example.log", identities.kubeconfig("dra-example")
        )
        example.start(bed)
        thick = MultusThick(found["multus_shim"], found["multus_daemon"], work, bins)
        thick.prepare(identities.tokens["multus"])
        shims = ShimLedger(tb._our_shims)
        shims.start()
        try:
            for round_ in range(args.rounds):
                for way in ways:
                    tag = f"r{round_}"
                    driver: DriverProcess | None = None
                    if way == "cnidra":
                        driver = start_cnidra(bed, work / f"cnidra-{round_}", parent)
                    ctx: AbstractContextManager[Any] = _nothing()
                    if way == "multus":
                        ctx = multus_installed(
                            found["multus"], work, identities.kubeconfig("multus")
                        )
                    elif way == "multus_thick":
                        ctx = thick.installed()
                    if driver is not None:
                        round_cpu, round_requests = cpu_seconds(driver), driver.metrics()
                    with ctx:
                        daemon = {"cnidra": driver, "dra_example": example, "multus_thick": thick}
                        node = Window(node_pids(daemon.get(way)))
                        plane = Window({name: tb.running(name) for name in CONTROL_PLANE})
                        shims.owner = way
                        audit.start()
                        single[way] += burst(bed, client, namespace, way, 1, f"{tag}s")
                        cpu = cpu_seconds(driver)
                        with profiled(driver, args.profile, f"cnidra-{args.pods}-pods-{tag}"):
                            samples[way] += burst(bed, client, namespace, way, args.pods, tag)
                        if driver is not None:
                            driver_cpu.append(cpu_seconds(driver) - cpu)
                            settled(driver)
                        node_cpu.add(way, node.end(), args.pods + 1)
                        plane_cpu.add(way, plane.end(), args.pods + 1)
                        if way in PEER_OF and audit_on:
                            time.sleep(2)  # the last pods' DELs (after the CPU windows)
                            kinds, agents = audit.end(PEER_OF[way])
                            peer_cost[way].requests.update(kinds)
                            peer_cost[way].agents |= agents
                            peer_cost[way].pods += args.pods + 1
                        shims.owner = None
                        lingering[way] = lingering.get(way, 0) + shims.alive(way)
                    if driver is not None:
                        cost.add(
                            cpu_seconds(driver) - round_cpu,
                            requests_by_kind(round_requests),
                            requests_by_kind(driver.metrics()),
                            args.pods + 1,
                        )
                        split = breakdown(driver.metrics(), args.pods + 1)
                        cnidra_split.append(split)
                        times = hook_ms(driver.log, namespace)
                        hooks["single"] += times[:1]
                        hooks["burst"] += times[1:]
                        driver.stop()
                    if not args.json:
                        print(
                            f"round {round_ + 1}/{args.rounds} {way:12} "
                            f"p50 {pct(samples[way][-args.pods :], 0.5):.2f} s  "
                            f"p99 {pct(samples[way][-args.pods :], 0.99):.2f} s  "
                            f"(1 pod {single[way][-1]:.2f} s)",
                            flush=True,
                        )
            # the shims of the last ways' pods, until they are gone (60 s at most)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and any(shims.alive(w) for w in WAYS):
                time.sleep(0.5)
        finally:
            shims.stop()
            example.stop()
            identities.remove(bed)
            bed.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
            delete_pool(bed, pool)
            subprocess.run(["ip", "link", "del", parent], check=False, capture_output=True)
        raw = raw_cni(bins)
    result: dict[str, Any] = {"pods": args.pods, "rounds": args.rounds}
    for way in ways:
        result[way] = stats(samples[way])
        # each round's burst alone: "below Multus in every round" is judged on these
        result[way]["by_round"] = [
            stats(samples[way][i * args.pods : (i + 1) * args.pods]) for i in range(args.rounds)
        ]
    if "cnidra" in ways:
        result["cnidra"].update(cost.per_pod())
    for way, spent in peer_cost.items():
        if spent.pods:
            result[way].update(spent.per_pod())
    result["raw_cni_ms"] = raw
    result["one_pod"] = {way: stats(single[way]) for way in ways}
    result["cnidra_time_per_pod_ms"] = {
        key: round(sum(s[key] for s in cnidra_split) / len(cnidra_split), 2)
        for key in (cnidra_split[0] if cnidra_split else ())
    }
    result["cnidra_hook_ms"] = {
        phase: {"p50": round(pct(v, 0.5), 2), "p99": round(pct(v, 0.99), 2)}
        for phase, v in hooks.items()
        if v
    }
    if driver_cpu:
        result["cnidra_driver_cpu_s_per_burst"] = round(sum(driver_cpu) / len(driver_cpu), 2)
    for way, seconds in shims.charged().items():
        node_cpu.add(way, {"shims": seconds}, 0)
    on_node = node_cpu.per_pod(NODE_PARTS)
    # the node's whole CPU per pod beyond the `none` way's (bench/node_cpu.py: what is in it)
    result["node_cpu_ms_per_pod"] = on_node["ms_per_pod"]
    result["node_cpu_ms_per_pod_by_part"] = on_node["by_part"]
    result["node_shims_alive_after_rounds"] = lingering
    elsewhere = plane_cpu.per_pod(CONTROL_PLANE)
    result["control_plane_cpu_ms_per_pod"] = elsewhere["ms_per_pod"]
    result["control_plane_cpu_ms_per_pod_by_part"] = elsewhere["by_part"]
    result["seconds"] = round(time.monotonic() - started)
    if not args.json:
        print(json.dumps(result, indent=2))
    print(json.dumps(result))


def node_pids(daemon: DriverProcess | ExampleDriver | MultusThick | None) -> dict[str, int | None]:
    """The node's processes whose CPU a way's rounds are charged: containerd, kubelet and the
    way's own daemon (with the plugins it execs and reaps)."""
    proc = daemon.proc if daemon is not None else None
    return {
        "containerd": tb.running("containerd"),
        "kubelet": tb.running("kubelet"),
        "daemon": proc.pid if proc is not None else None,
    }


def cpu_seconds(driver: DriverProcess | None) -> float:
    """User + system CPU time of the driver process so far."""
    if driver is None or driver.proc is None:
        return 0.0
    fields = Path(f"/proc/{driver.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def _nothing() -> Iterator[None]:
    yield


if __name__ == "__main__":
    main()
