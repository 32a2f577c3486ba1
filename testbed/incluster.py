"""cnidra as clusters run it, on the test bed: the image `make image` builds, loaded into the
test bed's containerd; a Helm release of charts/cnidra; and `InClusterDriver`, the DaemonSet's
pod seen through the same face as `DriverProcess` (health, stop, start, state root), so one
end-to-end test runs against either."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from cnidra.state.layout import DEFAULT_STATE_ROOT
from testbed import cluster as tb
from testbed.harness import ROOT, Cluster, health_at, helm, metrics_at

NAMESPACE = "cnidra-system"
RELEASE = "cnidra"
IMAGE_ARCHIVE = ROOT / "dist" / "cnidra-image.tar"
FAULT_PLUGINS = ROOT / "tests" / "cni" / "faults"


PLUGINS_IMAGE_ARCHIVE = ROOT / "dist" / "cnidra-image-cni-plugins.tar"


def build_image(*, cni_plugins: bool = False) -> str:
    """`make image`'s build (`make image-cni-plugins`'s with `cni_plugins`); the digest."""
    return _build("1" if cni_plugins else "0")[0]


def build_images() -> tuple[str, str]:
    """The plain image and the one that bundles the CNI plugins, from one build (one base and
    app layer): dist/cnidra-image.tar and dist/cnidra-image-cni-plugins.tar; their digests."""
    plain, plugins = _build("both")
    return plain, plugins


def _build(which: str) -> list[str]:
    out = subprocess.run(
        [ROOT / "hack" / "image" / "build.sh"],
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHON": sys.executable, "CNI_PLUGINS": which},
    )
    return out.stdout.strip().splitlines()[-(2 if which == "both" else 1) :]


def load_image(cluster: Cluster, archive: Path = IMAGE_ARCHIVE) -> None:
    subprocess.run(
        [str(cluster.bins.containerd / "ctr"), "-a", str(tb.Paths.containerd_sock), "-n",
         "k8s.io", "images", "import", str(archive)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip


def values(cluster: Cluster) -> dict[str, Any]:
    """The test bed's node paths (kubelet's root, containerd's state, the reference plugins and
    the tests' fault plugins) and its apiserver, which host-network pods reach on loopback (the
    test bed runs no kube-proxy). Everything else is the chart's default."""
    return {
        # the paths below are the first node's (a second node, when up, has its own)
        "nodeSelector": {"kubernetes.io/hostname": tb.NODE},
        "apiServer": {"host": "127.0.0.1", "port": str(tb.APISERVER_PORT)},
        "hostPaths": {
            "kubeletPluginsRegistry": str(tb.Paths.plugins_registry),
            "kubeletPlugins": str(tb.Paths.plugins),
            "nriSocketDir": str(tb.Paths.nri_sock.parent),
            "netns": str(tb.Paths.netns),
            "cdi": str(tb.Paths.cdi),
            "cniConf": str(tb.Paths.cni_conf),
            "cniBin": str(cluster.bins.cni_plugins),
            "extraCNIBin": [str(FAULT_PLUGINS)],
        },
    }


class Release:
    """A Helm release of charts/cnidra with the test bed's values file."""

    def __init__(self, cluster: Cluster, values_file: Path) -> None:
        self.cluster = cluster
        self.values_file = values_file
        values_file.write_text(yaml.safe_dump(values(cluster)))

    def helm(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [helm(), *args, "-n", NAMESPACE],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **self.cluster.env},
            check=False,
        )
        if out.returncode != 0:
            raise AssertionError(f"helm {' '.join(args[:2])} failed: {out.stderr}")
        return out

    def install(self, *sets: str, values: Sequence[Path] = ()) -> None:
        """`values`: values files over the test bed's (the chart's ci/ files, as
        chart-testing installs with each)."""
        extra = [a for v in values for a in ("-f", str(v))]
        # --take-ownership: other tests apply deploy/'s objects (the DeviceClass) themselves
        self.helm("install", RELEASE, str(ROOT / "charts" / "cnidra"), "--create-namespace",
                  "-f", str(self.values_file), *extra, *(f"--set={s}" for s in sets), "--wait",
                  "--timeout", "120s", "--take-ownership")  # fmt: skip

    def upgrade(self, *sets: str, values: Sequence[Path] = ()) -> None:
        """`values`: as for `install` (chart-testing's `--upgrade` to another values set)."""
        extra = [a for v in values for a in ("-f", str(v))]
        self.helm("upgrade", RELEASE, str(ROOT / "charts" / "cnidra"), "-f",
                  str(self.values_file), *extra, *(f"--set={s}" for s in sets), "--wait",
                  "--timeout", "120s")  # fmt: skip

    def uninstall(self) -> None:
        self.helm("uninstall", RELEASE, "--wait")

    def installed(self) -> bool:
        return RELEASE in self.helm("list", "-q").stdout.split()


class InClusterDriver:
    """The driver container of the DaemonSet's pod on the test bed's one node."""

    state_root = DEFAULT_STATE_ROOT  # the chart's hostPaths.state, the same path inside
    port = 9177  # the chart's driver.httpAddress (host network)

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.stopped_pid: int | None = None
        # where the driver serves /healthz and /metrics: loopback by default, the node's
        # address when the chart's metrics Service is on (`listen_on_node`)
        self.host = "127.0.0.1"

    def health(self) -> dict[str, Any]:
        return health_at(self.port, self.host)

    def metrics(self) -> str:
        return metrics_at(self.port, self.host)

    def listen_on_node(self, on: bool = True) -> None:
        """With `metrics.service.enabled` the driver listens on its pod's (the node's)
        address, for the Service, not on loopback."""
        if not on:
            self.host = "127.0.0.1"
            return
        self.host = self.cluster.kubectl(
            "get", "node", tb.NODE, "-o",
            "jsonpath={.status.addresses[?(@.type==\"InternalIP\")].address}",
        ).stdout.strip()  # fmt: skip

    def container(self) -> tuple[str, int]:
        """The running driver container's id and its process's pid on the node."""
        ids = self.cluster.crictl(
            "ps", "-q", "--state", "running", "--name", "^driver$",
            "--label", f"io.kubernetes.pod.namespace={NAMESPACE}",
        ).stdout.split()  # fmt: skip
        if len(ids) != 1:
            raise AssertionError(f"expected one running driver container, found {ids}")
        info = json.loads(self.cluster.crictl("inspect", ids[0]).stdout)
        return ids[0], int(info["info"]["pid"])

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Signal the driver's process; kubelet restarts the container (its restartPolicy)."""
        _, pid = self.container()
        os.kill(pid, sig)
        self.cluster.wait("the driver process to exit", lambda: not Path(f"/proc/{pid}").exists())
        self.stopped_pid = pid

    def start(self, wait_registered: bool = True) -> None:
        """Wait for kubelet's restart of the container and the new process to be ready."""

        def restarted() -> bool:
            try:
                _, pid = self.container()
            except AssertionError:
                return False
            return pid != self.stopped_pid

        self.cluster.wait("kubelet to restart the driver container", restarted, 90)
        if wait_registered:
            self.cluster.wait(
                "the restarted driver to register with kubelet",
                lambda: self.health().get("registeredWithKubelet"),
                60,
            )

    def wait_ready(self, timeout: float = 60) -> None:
        self.cluster.wait(
            "the in-cluster driver to register with kubelet and connect to NRI",
            lambda: (h := self.health()).get("registeredWithKubelet") and h.get("nriConnected"),
            timeout,
        )


def wait_gone(cluster: Cluster, timeout: float = 90) -> None:
    """After an uninstall: kubelet removes the node's slices once the plugin is gone (the
    first node's: a second node's driver is the test's own)."""

    def ours() -> list[str]:
        slices = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json").stdout)
        return [
            s["metadata"]["name"]
            for s in slices["items"]
            if s["spec"]["driver"] == "cni.dra.networking.x-k8s.io"
            and s["spec"].get("nodeName") == tb.NODE
        ]

    cluster.wait("kubelet to remove the driver's slices", lambda: not ours(), timeout)
