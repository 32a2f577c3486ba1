"""Processes of the test bed: started by name with a pid file and a log, stopped by pid;
kubectl and crictl; the shims, mounts and cgroups that belong to a node."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from testbed.layout import NODE1, ROOT, Bins, Node, Paths, log


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


# seconds a component is given to exit on SIGTERM before SIGKILL. kube-apiserver stops listening
# and drains its requests within milliseconds of SIGTERM, then does not exit for as long as it is
# given (measured: killed at 10 s, every time), so it gets a second: its state is etcd's.
GRACE = {"kube-apiserver": 1.0}


def stop(name: str, grace: float | None = None) -> None:
    grace = GRACE.get(name, 10.0) if grace is None else grace
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


def host_drivers(under: Path = ROOT) -> list[int]:
    """`cnidra driver` processes on the host set up for this test bed (their NRI socket is one of
    its nodes'), whoever started them: a run killed mid-test leaves its drivers behind, still
    registered with kubelet and connected to NRI, and the next run's pods would meet them."""
    pids = []
    marker = f"CNIDRA_NRI_SOCKET={under}/".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if b"driver" not in argv or not any(a.endswith(b"cnidra") for a in argv):
                continue
            if any(v.startswith(marker) for v in (proc / "environ").read_bytes().split(b"\0")):
                pids.append(int(proc.name))
    return pids


def _mounts_under_root(under: Path = ROOT) -> list[str]:
    out = Path("/proc/self/mountinfo").read_text().splitlines()
    targets = [line.split()[4] for line in out]
    root = str(under)
    return sorted(
        {t for t in targets if t == root or t.startswith(root + "/")}, key=len, reverse=True
    )


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
