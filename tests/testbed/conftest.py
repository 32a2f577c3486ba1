"""The single-node Kubernetes test bed as a pytest session fixture: brought up (built or reused
from the cache) once, brought down after the session unless it was already running."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cnidra.state.layout import DEFAULT_STATE_ROOT
from testbed import cluster as tb
from testbed.harness import ROOT, Cluster
from testbed.incluster import Release, wait_gone


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    with tb.session() as bins:
        yield Cluster(bins, tb.env_dict())


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    # pods are refused until the controller-manager has made the namespace's ServiceAccount
    cluster.wait(
        f"the default ServiceAccount in {name}",
        lambda: (
            cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode
            == 0
        ),
        60,
    )
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def pod(name: str, image: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": image, "command": ["sleep", "3600"]}],
            **spec,
        },
    }


def env_image() -> str:
    return os.environ.get("TESTBED_IMAGE", tb.TEST_IMAGE)


@pytest.fixture
def test_link(request: pytest.FixtureRequest) -> Iterator[Callable[[str], str]]:
    """Makes host-only bridges (nothing enslaved to them) that stand in for data NICs."""
    made: list[str] = []

    def make(name: str) -> str:
        subprocess.run(["ip", "link", "add", name, "type", "bridge"], check=True)
        subprocess.run(["ip", "link", "set", name, "up"], check=True)
        made.append(name)
        return name

    yield make
    for name in made:
        subprocess.run(["ip", "link", "del", name], check=False, capture_output=True)


def cnidra_crds(cluster: Cluster) -> None:
    """deploy/'s CRDs, served before this returns (the pools' and blocks' at least)."""
    cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "crds.yaml"))
    cluster.wait(
        "the CRDs to be served",
        lambda: cluster.kubectl("get", "cniippools,cniipblocks", check=False).returncode == 0,
        60,
    )


def ip_pool(name: str, subnet: str, namespaces: list[str], **range_: Any) -> dict[str, Any]:
    """An admin's CNIIPPool of one range that serves the tenants of `namespaces`."""
    return {
        "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
        "kind": "CNIIPPool",
        "metadata": {"name": name},
        "spec": {
            "ranges": [{"subnet": subnet, **range_}],
            **({"namespaces": namespaces} if namespaces else {}),
        },
    }


def pool_leases(state_root: Path, pool: str | None = None) -> dict[str, dict[str, Any]]:
    """The addresses a driver with this state root has leased (of one pool, or of all),
    address -> its Lease (pool, address, block, owner `claim/<uid>/<request>` or
    `ipamclaim/...`, holder `claim <namespace>/<name>`): cnidra.state.ipam's files."""
    out = {}
    for path in (state_root / "pools" / "addresses").glob("*.json"):
        try:
            lease = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # freed meanwhile
        if pool is None or lease.get("pool") == pool:
            out[lease["address"]] = lease
    return out


@pytest.fixture
def ip_pools(cluster: Cluster) -> Iterator[Callable[..., str]]:
    """Makes CNIIPPools (a unique name each), as an admin does for tenants: `make(subnet,
    *namespaces, **range fields)` -> the pool's name, for `ipam: {type: cnidra, pool: NAME}`.
    Deleted at the end with the blocks nodes reserved in them."""
    cnidra_crds(cluster)
    made: list[str] = []

    def make(subnet: str, *namespaces: str, name: str = "", **range_: Any) -> str:
        name = name or f"tb-{uuid.uuid4().hex[:8]}"
        cluster.apply(ip_pool(name, subnet, list(namespaces), **range_))
        made.append(name)
        return name

    yield make
    for name in made:
        cluster.kubectl("delete", "cniippool", name, "--ignore-not-found", check=False)
        cluster.kubectl(
            "delete", "cniipblocks", "-l", f"cni.networking.x-k8s.io/pool={name}", check=False
        )


@pytest.fixture(scope="module")
def second_node(cluster: Cluster) -> Iterator[tb.Node]:
    """The test bed's second node (tainted: only pods that tolerate it land there), up for the
    module's tests."""
    tb.node2_up(cluster.bins)
    try:
        yield tb.NODE2
    finally:
        tb.node2_down(cluster.bins)


@pytest.fixture(scope="session")
def image(cluster: Cluster) -> str:
    """`make image`'s image, built once per session and loaded into the test bed's containerd;
    its digest."""
    from testbed.incluster import build_image, load_image

    digest = build_image()
    load_image(cluster)
    return digest


@pytest.fixture(scope="module", params=["host", "in-cluster"])
def deployment(
    request: pytest.FixtureRequest, cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release | None]:
    """Every test of a module that uses it runs twice: against `cnidra driver` as a host process
    (None: the module starts it), and against the DaemonSet pod of a `helm install` of the
    image (its defaults)."""
    if request.param == "host":
        yield None
        return
    request.getfixturevalue("image")
    release = Release(cluster, tmp_path_factory.mktemp("release") / "values.yaml")
    assert not DEFAULT_STATE_ROOT.exists() or not any(DEFAULT_STATE_ROOT.glob("*/*")), (
        f"{DEFAULT_STATE_ROOT} holds state of something else"
    )
    release.install()
    try:
        yield release
    finally:
        release.uninstall()
        wait_gone(cluster)
        left = [p for p in DEFAULT_STATE_ROOT.glob("[cs]*/*.json")]
        shutil.rmtree(DEFAULT_STATE_ROOT, ignore_errors=True)
        assert not left, f"claims or sandboxes left after the last pod went: {left}"
