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

The parts, by concern: `testbed.layout` (root, ports, ranges, images, gates; Bins, Node,
Paths), `testbed.pki` (certificates, kubeconfigs), `testbed.configs` (the components' config
files), `testbed.processes` (start/stop by pid, kubectl, crictl, a node's shims, mounts and
cgroups), `testbed.components` (each component brought up, the second node, a reboot); this
module composes them (build, up, down, status, env, session) and re-exports their names.

`node2-up` adds a second node, `testbed-node2`, for the tests that need two (tainted, so no
other pod lands there): its own network namespace joined to the machine's by a veth of
198.18.126.0/30 (its kubelet listens there for the apiserver), its own containerd and kubelet,
pods from 198.18.129.0/24. `node2-down` (and `down`) remove it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from testbed.components import (  # noqa: F401
    _node_ready,
    import_images,
    make_bridge,
    make_uplink,
    node2_down,
    node2_up,
    reboot,
    restart_kubelets,
    share_netns_dir,
    start_apiserver,
    start_containerd,
    start_controllers,
    start_etcd,
    start_kubelet,
)
from testbed.configs import (  # noqa: F401
    PRIMARY_PLUGIN,
    SLOW_PLUGIN,
    write_configs,
    write_node_configs,
    write_test_plugins,
)
from testbed.layout import (  # noqa: F401
    APISERVER_PORT,
    BRIDGE,
    ETCD_CLIENT,
    ETCD_PEER,
    FEATURE_GATES,
    GATES,
    HACK,
    HERE,
    NODE,
    NODE1,
    NODE2,
    NODE2_HOST_IP,
    NODE2_NETNS,
    NODE2_UPLINK,
    NODE_IP,
    PAUSE_IMAGE,
    POD_GATEWAY,
    POD_SUBNET,
    REPO,
    ROOT,
    RUNTIME_CONFIG,
    SECOND_NODE_TAINT,
    SERVICE_CIDR,
    SERVICE_IP,
    TEST_IMAGE,
    WORK,
    Bins,
    Node,
    Paths,
    log,
)
from testbed.pki import _cert, _openssl, kubeconfig, make_pki, node_certs  # noqa: F401
from testbed.processes import (  # noqa: F401
    KubectlError,
    _mounts_under_root,
    _our_shims,
    _pidfile,
    cgroup_roots,
    crictl,
    host_drivers,
    kubectl,
    make_cgroup_roots,
    port_open,
    remove_cgroup_roots,
    running,
    start,
    stop,
    wait_for,
)

# ----------------------------------------------------------------------------- layout


# ----------------------------------------------------------------------------- certificates


# ----------------------------------------------------------------------------- configs


# ----------------------------------------------------------------------------- processes


# ----------------------------------------------------------------------------- components


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


def down() -> None:
    bins = Bins.locate()
    node2_down(bins)
    if running("containerd") and Paths.containerd_sock.exists():
        crictl(bins, "rmp", "--all", "--force", check=False)
    for name in reversed(COMPONENTS):
        stop(name)
    for pid in _our_shims() + host_drivers():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(0.3)
    for target in _mounts_under_root():
        subprocess.run(["umount", "-l", target], check=False, capture_output=True)
    subprocess.run(["ip", "link", "del", BRIDGE], check=False, capture_output=True)
    log("down: processes stopped, mounts removed, bridge deleted")
    KEPT.unlink(missing_ok=True)
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


# `up` from the command line (or a pytest run with CNIDRA_TESTBED_KEEP=1) leaves this file: a
# test bed somebody keeps on purpose, which a session reuses. One running without it was left by
# a run that was killed before its `down`, with whatever that run had installed still in it.
KEPT = ROOT / "kept"
# held by each session for its whole length: a second run (a soak beside `make test`, CI beside
# a developer's run on one machine) waits for the first instead of sharing its test bed.
SESSION_LOCK = ROOT / "session.lock"


@contextlib.contextmanager
def _exclusive(path: Path, wait: float) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as f:
        deadline = time.monotonic() + wait
        told = False
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    f.seek(0)
                    raise SystemExit(
                        f"the test bed is still in use by another run ({f.read().strip()}) "
                        f"after {wait:.0f} s; see {path}"
                    ) from None
                if not told:
                    f.seek(0)
                    log(f"the test bed is in use by another run ({f.read().strip()}); waiting")
                    told = True
                time.sleep(2)
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}: {' '.join(sys.argv)[:200]}\n")
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def session(wait: float = 3 * 3600) -> Iterator[Bins]:
    """For pytest and the benchmarks: the test bed to this run alone (another run's session is
    waited for, up to `wait` seconds), brought up for it and down after it. A test bed kept on
    purpose (`up`, CNIDRA_TESTBED_KEEP=1) is reused and left up; one a killed run left behind,
    or half of one, is brought down first."""
    with _exclusive(SESSION_LOCK, wait):
        up_now = [n for n in COMPONENTS if running(n)]
        was_running = len(up_now) == len(COMPONENTS) and KEPT.exists()
        if up_now and not was_running:
            log(f"{', '.join(up_now)} left running by an interrupted run: brought down first")
            down()
        if not was_running:
            up()
        try:
            yield Bins.locate()
        finally:
            if os.environ.get("CNIDRA_TESTBED_KEEP") == "1":
                KEPT.touch()
            elif not was_running:
                down()


def main(argv: Sequence[str]) -> int:
    command = argv[1] if len(argv) > 1 else "status"
    if command == "up":
        up()
        KEPT.touch()
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
