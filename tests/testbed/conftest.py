"""The single-node Kubernetes test bed as a pytest session fixture: brought up (built or reused
from the cache) once, brought down after the session unless it was already running."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from testbed import cluster as tb
from testbed.harness import Cluster


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


@pytest.fixture(scope="session")
def image(cluster: Cluster) -> str:
    """`make image`'s image, built once per session and loaded into the test bed's containerd;
    its digest."""
    from testbed.incluster import build_image, load_image

    digest = build_image()
    load_image(cluster)
    return digest
