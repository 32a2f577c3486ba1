"""The driver as clusters run it: the image `make image` builds, loaded into the test bed's
containerd, installed with `helm install` from charts/cnidra, its DaemonSet pod registering
with kubelet, publishing its slice, serving NRI and passing its /healthz probes, attaching a
pod's interface and writing the claim's status with its own ServiceAccount; `helm upgrade` rolls
it while the pod keeps its interface; `helm uninstall` leaves no slice and no finalizer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cnidra.state.layout import DEFAULT_STATE_ROOT
from testbed import cluster as tb
from testbed.harness import ROOT, Cluster, helm
from tests.testbed.test_lifecycle import claiming_pod, cni_config, pod_addresses, ready, template

pytestmark = pytest.mark.testbed
NAMESPACE = "cnidra-system"


def values(cluster: Cluster) -> dict[str, Any]:
    """The test bed's node paths (kubelet's root, containerd's state) and its apiserver, which
    host-network pods reach on loopback (the test bed runs no kube-proxy)."""
    return {
        "apiServer": {"host": "127.0.0.1", "port": str(tb.APISERVER_PORT)},
        "hostPaths": {
            "kubeletPluginsRegistry": str(tb.Paths.plugins_registry),
            "kubeletPlugins": str(tb.Paths.plugins),
            "nriSocketDir": str(tb.Paths.nri_sock.parent),
            "netns": str(tb.Paths.netns),
            "cniBin": str(cluster.bins.cni_plugins),
        },
    }


@pytest.fixture(scope="module")
def image(cluster: Cluster) -> str:
    out = subprocess.run(
        [ROOT / "hack" / "image" / "build.sh"],
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHON": sys.executable},
    )
    digest = out.stdout.strip().splitlines()[-1]
    sock = str(tb.Paths.containerd_sock)
    subprocess.run(
        [str(cluster.bins.containerd / "ctr"), "-a", sock, "-n", "k8s.io", "images", "import",
         str(ROOT / "dist" / "cnidra-image.tar")],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return digest


@pytest.fixture
def release(cluster: Cluster, image: str, tmp_path: Path) -> Iterator[Path]:
    assert not DEFAULT_STATE_ROOT.exists() or not any(DEFAULT_STATE_ROOT.iterdir())
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values(cluster)))
    env = {**os.environ, **cluster.env}
    run = [helm(), "install", "cnidra", str(ROOT / "charts" / "cnidra"), "-n", NAMESPACE,
           "--create-namespace", "-f", str(path), "--wait", "--timeout", "120s",
           "--take-ownership"]  # other tests apply deploy/'s objects themselves  # fmt: skip
    subprocess.run(run, check=True, capture_output=True, text=True, timeout=180, env=env)
    try:
        yield path
    finally:
        subprocess.run(
            [helm(), "uninstall", "cnidra", "-n", NAMESPACE, "--wait"],
            capture_output=True, timeout=180, env=env, check=False,
        )  # fmt: skip
        shutil.rmtree(DEFAULT_STATE_ROOT, ignore_errors=True)


def healthz() -> dict[str, Any]:
    with urllib.request.urlopen("http://127.0.0.1:9177/healthz", timeout=3) as r:
        data: dict[str, Any] = json.loads(r.read())
        return data


def test_installed_with_helm_the_driver_serves_pods(
    cluster: Cluster, release: Path, test_link: Any
) -> None:
    env = {**os.environ, **cluster.env}
    state = cluster.wait(
        "the driver to register with kubelet and connect to NRI",
        lambda: (h := healthz()).get("registeredWithKubelet") and h.get("nriConnected") and h,
        60,
    )
    assert state["ok"] and all(t["running"] for t in state["tasks"].values()), state
    with urllib.request.urlopen("http://127.0.0.1:9177/metrics", timeout=3) as r:
        assert b"cnidra_dra_requests_total" in r.read()

    ns = f"ic-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)
    cluster.kubectl("label", "namespace", ns, "cni.networking.x-k8s.io/claim-config=true")
    cluster.wait(
        "the namespace's ServiceAccount",
        lambda: cluster.kubectl("get", "sa", "default", "-n", ns, check=False).returncode == 0,
    )
    parent = test_link(f"tbi{uuid.uuid4().hex[:5]}")
    cluster.wait("the slice", lambda: parent in cluster.kubectl(
        "get", "resourceslices", "-o", "json").stdout, 30)  # fmt: skip
    conf = cni_config("incluster", parent, "198.18.241.0/24")
    docs = [template("net", [("net", parent, conf, "net1")]), claiming_pod("p1", "net")]
    cluster.kubectl(
        "apply", "-n", ns, "-f", "-", input_="\n---\n".join(json.dumps(d) for d in docs)
    )
    ready(cluster, ns, "p1")
    before = pod_addresses(cluster, ns, "p1", "net1")
    assert len(before) == 1
    status = cluster.wait(
        "the claim status, written by the in-cluster driver",
        lambda: json.loads(cluster.kubectl("get", "resourceclaims", "-n", ns, "-o", "json").stdout)[
            "items"][0].get("status", {}).get("devices"),
        30,
    )  # fmt: skip
    assert status[0]["networkData"]["ips"] == sorted(before)

    # a rolling upgrade (a new pod spec) while the pod runs: it keeps its interface and address
    start = time.monotonic()
    subprocess.run(
        [helm(), "upgrade", "cnidra", str(ROOT / "charts" / "cnidra"), "-n", NAMESPACE, "-f",
         str(release), "--set", "driver.logLevel=debug", "--wait", "--timeout", "120s"],
        check=True, capture_output=True, timeout=180, env=env,
    )  # fmt: skip
    cluster.wait("the new driver", lambda: healthz().get("nriConnected"), 60)
    print(f"helm upgrade to a ready driver: {time.monotonic() - start:.1f} s")
    assert pod_addresses(cluster, ns, "p1", "net1") == before
    cluster.kubectl("apply", "-n", ns, "-f", "-", input_=json.dumps(claiming_pod("p2", "net")))
    ready(cluster, ns, "p2")
    assert len(pod_addresses(cluster, ns, "p2", "net1")) == 1

    for name in ("p1", "p2"):
        cluster.kubectl("delete", "pod", name, "-n", ns, "--timeout=60s")
    cluster.wait("no sandbox record", lambda: healthz().get("sandboxes") == 0, 30)
    claims = json.loads(cluster.kubectl("get", "resourceclaims", "-n", ns, "-o", "json").stdout)
    assert not [c for c in claims["items"] if c["metadata"].get("finalizers")]
    subprocess.run([helm(), "uninstall", "cnidra", "-n", NAMESPACE, "--wait"],
                   check=True, capture_output=True, timeout=180, env=env)  # fmt: skip
    cluster.wait(
        "kubelet to remove the driver's slices",
        lambda: "cni.dra.networking.x-k8s.io" not in cluster.kubectl(
            "get", "resourceslices", "-o", "json").stdout,
        90,
    )  # fmt: skip
    cluster.kubectl("delete", "namespace", ns, "--wait=false")


def layer_names(archive: Path) -> set[str]:
    import gzip
    import io
    import tarfile

    names: set[str] = set()
    with tarfile.open(archive) as oci:

        def blob(digest: str) -> bytes:
            member = oci.extractfile(f"blobs/sha256/{digest.split(':', 1)[1]}")
            assert member is not None
            return member.read()

        index = json.loads(oci.extractfile("index.json").read())  # type: ignore[union-attr]
        manifest = json.loads(blob(index["manifests"][0]["digest"]))
        for layer in manifest["layers"]:
            with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob(layer["digest"])))) as t:
                names |= set(t.getnames())
    return names


def test_the_image_is_reproducible_and_has_no_shell(image: str) -> None:
    again = subprocess.run(
        [ROOT / "hack" / "image" / "build.sh"],
        check=True, capture_output=True, text=True, timeout=900,
        env={**os.environ, "PYTHON": sys.executable},
    ).stdout.strip().splitlines()[-1]  # fmt: skip
    assert again == image  # same commit, same digest
    names = layer_names(ROOT / "dist" / "cnidra-image.tar")
    assert "usr/local/bin/cnidra" in names and "usr/bin/python3.11" in names
    assert not names & {"usr/bin/sh", "usr/bin/bash", "usr/bin/dash", "usr/bin/apt-get"}
    assert not names & {"usr/bin/gcc", "usr/bin/cc", "usr/bin/g++", "usr/bin/make"}
    size = (ROOT / "dist" / "cnidra-image.tar").stat().st_size
    print(f"image archive: {size / 2**20:.1f} MiB")
