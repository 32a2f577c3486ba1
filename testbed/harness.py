"""Driving the test bed from Python: `Cluster` (kubectl, crictl, waiting) and `DriverProcess`
(`cnidra driver` as a real process, on a free port, ready when /healthz says so). Used by the
tests and the benchmarks alike."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from bench import grpc_stubs as dra_grpc
from cnidra._proto.dra.v1 import api_pb2 as dra
from cnidra.state.layout import DEFAULT_STATE_ROOT
from cnidra.state.store import read_records
from testbed import cluster as tb

ROOT = Path(__file__).parents[1]


@dataclass
class Cluster:
    bins: tb.Bins
    env: dict[str, str]

    def kubectl(
        self, *args: str, check: bool = True, input_: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return tb.kubectl(self.bins, *args, check=check, input_=input_, timeout=timeout)

    def apply(self, *docs: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input_="\n---\n".join(json.dumps(d) for d in docs))

    def apply_in(self, namespace: str, *docs: dict[str, Any]) -> None:
        self.kubectl(
            "apply", "-n", namespace, "-f", "-", input_="\n---\n".join(json.dumps(d) for d in docs)
        )

    def install_cnidra_api(self) -> None:
        """deploy/'s CRDs (served before this returns) and DeviceClasses, as the chart installs
        them."""
        self.kubectl("apply", "-f", str(ROOT / "deploy" / "crds.yaml"))
        self.wait(
            "the CRDs to be served",
            lambda: (
                self.kubectl(
                    "get", "cniippools,cniipblocks,ipamclaims", "-A", check=False
                ).returncode
                == 0
            ),
            60,
        )
        self.kubectl("apply", "-f", str(ROOT / "deploy" / "deviceclass.yaml"))

    def get(self, kind: str, name: str, namespace: str | None = "default") -> dict[str, Any]:
        ns = ["-n", namespace] if namespace else []
        out: dict[str, Any] = json.loads(self.kubectl("get", kind, name, *ns, "-o", "json").stdout)
        return out

    def events(self, name: str, namespace: str = "default") -> list[dict[str, Any]]:
        out = self.kubectl(
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            f"involvedObject.name={name}",
            "-o",
            "json",
        ).stdout
        items: list[dict[str, Any]] = json.loads(out)["items"]
        return items

    def crictl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return tb.crictl(self.bins, *args)

    def wait(self, what: str, check: Callable[[], object], timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = check()
                if last:
                    return last
            except Exception as exc:
                last = exc
            time.sleep(0.3)
        raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def helm() -> str:
    """The helm binary, built from the Go module proxy and cached by version."""
    out = subprocess.run(
        [ROOT / "hack" / "install-helm.sh"],
        check=True,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    return out.stdout.strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DriverProcess:
    def __init__(
        self,
        cluster: Cluster,
        state_dir: Path,
        extra_env: dict[str, str] | None = None,
        *,
        defaults: bool = False,
        source: Path | None = None,
        node: tb.Node = tb.NODE1,
        **settings: str,
    ) -> None:
        """`state_dir` holds the log, and the driver's state root unless `defaults`: then the
        driver keeps its state where deploy/ has it, /var/lib/cnidra. `source`: run the driver
        from another checkout (benchmarks of an older commit). `node`: the test bed's node it
        serves, in that node's network namespace (the second node's driver answers HTTP on
        the node's IP, which the machine reaches over the node's veth)."""
        self.source = source or ROOT
        self.cluster = cluster
        self.node = node
        self.state_root = DEFAULT_STATE_ROOT if defaults else state_dir / "state"
        self.port = free_port()  # a free port per process: drivers never collide
        self.host = "127.0.0.1" if node.netns is None else node.ip
        self.log = state_dir / "driver.log"
        self.env = {
            **os.environ,
            **cluster.env,
            **({} if node == tb.NODE1 else tb.node_env(node)),
            **({} if defaults else {"CNIDRA_STATE_DIR": str(self.state_root)}),
            "CNIDRA_HTTP_ADDRESS": f"{self.host}:{self.port}",
            "CNIDRA_RESYNC_SECONDS": "30",
            **{f"CNIDRA_{k.upper()}": v for k, v in settings.items()},
            **(extra_env or {}),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "the driver is not running"
        return self.proc.pid

    @property
    def dra_socket(self) -> str:
        return f"{self.env['CNIDRA_PLUGINS_DIR']}/cni.dra.networking.x-k8s.io/dra.sock"

    def start(self, wait_registered: bool = True) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.node.inside([sys.executable, "-m", "cnidra", "driver"]),
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.source,
                # its own session: a signal to the run's process group (`timeout` around a
                # benchmark, Ctrl-C) reaches the run, which reads its figures and then stops
                # the driver; `down` kills any the run could not (testbed.processes)
                start_new_session=True,
            )
        if wait_registered:
            self.cluster.wait(
                "kubelet to register the driver",
                lambda: self.health().get("registeredWithKubelet"),
                60,
            )

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def health(self) -> dict[str, Any]:
        return health_at(self.port, self.host)

    def metrics(self) -> str:
        return metrics_at(self.port, self.host)

    def checkpoint(self) -> list[dict[str, Any]]:
        return read_checkpoint(self.state_root)

    def prepare(self, *claims: tuple[str, str, str]) -> dra.NodePrepareResourcesResponse:
        with grpc.insecure_channel(f"unix://{self.dra_socket}") as channel:
            stub = dra_grpc.DRAPluginStub(channel)
            request = dra.NodePrepareResourcesRequest(
                claims=[dra.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
            )
            response: dra.NodePrepareResourcesResponse = stub.NodePrepareResources(
                request, timeout=30
            )
            return response

    def unprepare(self, *claims: tuple[str, str, str]) -> dra.NodeUnprepareResourcesResponse:
        with grpc.insecure_channel(f"unix://{self.dra_socket}") as channel:
            stub = dra_grpc.DRAPluginStub(channel)
            request = dra.NodeUnprepareResourcesRequest(
                claims=[dra.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
            )
            response: dra.NodeUnprepareResourcesResponse = stub.NodeUnprepareResources(
                request, timeout=30
            )
            return response

    def rss_kib(self) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")


def health_at(port: int, host: str = "127.0.0.1") -> dict[str, Any]:
    """A driver's /healthz: its details, also when it says 503; {} when down."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=2) as r:
            data: dict[str, Any] = json.loads(r.read())
            return data
    except urllib.error.HTTPError as exc:
        data = json.loads(exc.read())
        return data
    except OSError:
        return {}


def metrics_at(port: int, host: str = "127.0.0.1") -> str:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=2) as r:
        return str(r.read().decode())


def wait_for_log(path: Path, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not in {path}")


def read_checkpoint(state_root: Path) -> list[dict[str, Any]]:
    """The prepared claims a driver with this state root has checkpointed: the checkpoint's
    files with its log replayed over them (a running driver writes the files only when its
    store settles), in the order of their keys."""
    records = read_records(state_root / "claims")
    return [records[key] for key in sorted(records)]
