"""The single-node Kubernetes test bed as a pytest session fixture: brought up (built or reused
from the cache) once, brought down after the session unless it was already running."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cnidra.state.layout import DEFAULT_STATE_ROOT
from testbed import cluster as tb
from testbed.harness import Cluster
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
