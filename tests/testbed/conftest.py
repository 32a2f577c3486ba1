"""The single-node Kubernetes test bed as a pytest session fixture: brought up (built or reused
from the cache) once, brought down after the session unless it was already running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "hack" / "testbed"))
import testbed as tb  # noqa: E402


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
