"""Shared fixtures. Tests that need real plugins install them (cached); nothing is skipped for
want of a tool."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from cnidra.cni import netns

ROOT = Path(__file__).parents[1]

# Hypothesis' per-example deadline (200 ms of wall time) and its too_slow health check judge
# how loaded the machine is, not the code: under make test's unit half beside the test bed's
# on 2 cores, an example that takes 10 ms alone can take 400 ms. What a test's cost must stay
# under is asserted by the test (calls counted, CPU time), never by these.
settings.register_profile("cnidra", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("cnidra")


@dataclass(frozen=True)
class CNITools:
    plugins: str  # newest reference plugins, built with go install
    debian_plugins: str  # Debian's containernetworking-plugins (1.1.1)
    cnitool: str


@contextlib.contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """One build of `name` into the shared cache at a time, across processes: the hack/
    installers are idempotent but not concurrent (each rebuilds into its `.tmp` directory), and
    under pytest-xdist every worker runs a session fixture of its own."""
    cache = Path(os.environ.get("CNIDRA_CACHE") or Path.home() / ".cache" / "cnidra")
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def cni_tools() -> CNITools:
    with cache_lock("install-cni"):
        subprocess.run([ROOT / "hack" / "install-cni.sh"], check=True, timeout=1800)
    out = subprocess.run(
        [ROOT / "hack" / "install-cni.sh", "env"], check=True, text=True, capture_output=True
    ).stdout
    env = dict(line.removeprefix("export ").split("=", 1) for line in out.splitlines())
    return CNITools(
        env["CNIDRA_TEST_CNI_PATH"], env["CNIDRA_TEST_DEBIAN_CNI_PATH"], env["CNIDRA_TEST_CNITOOL"]
    )


@pytest.fixture
def node_netns() -> Iterator[Path]:
    """A throwaway namespace standing in for the node; plugins run inside it."""
    with netns.temporary("cnidra-node") as path:
        yield path


@pytest.fixture
def pod_netns() -> Iterator[Path]:
    with netns.temporary("cnidra-pod") as path:
        yield path


@pytest.fixture
def in_node(node_netns: Path) -> Iterator[Path]:
    """Run the test body (and every plugin it spawns) inside the node namespace."""
    with netns.entered(node_netns):
        yield node_netns


def ip_json(ns: Path, *args: str) -> list[dict[str, object]]:
    import json

    out = subprocess.run(
        ["ip", "-n", ns.name, "-j", *args], check=True, capture_output=True, text=True, timeout=30
    ).stdout
    return list(json.loads(out or "[]"))


def ip(ns: Path, *args: str) -> None:
    subprocess.run(["ip", "-n", ns.name, *args], check=True, capture_output=True, timeout=30)


# this run's namespaces carry its tag (cnidra.cni.netns.create; the `cnidra try` processes a
# test starts inherit it): the leak check below counts those only, never namespaces another run
# on the machine made meanwhile. Under pytest-xdist each worker is a process of its own that
# imports this module, so each worker has its own tag (tests/test_suite.py checks it), and a
# worker's check never counts what another worker's test made meanwhile.
RUN_TAG = f"t{os.getpid()}"
os.environ[netns.TAG_VARIABLE] = RUN_TAG

# the fixtures that need root (a network namespace, a mount): a test that uses one is marked
# netns
NEEDS_ROOT = {"node_netns", "pod_netns", "in_node", "small_disk"}
TESTBED_DIR = ROOT / "tests" / "testbed"
# the test bed's fixtures for the driver's image and the driver installed with helm
IN_CLUSTER_FIXTURES = {"image", "release"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The markers by what a test is: every test under tests/testbed is `testbed`, those that
    use the image or an in-cluster install `incluster` too; a test that uses a root fixture
    without `netns` is an error (it would run, and fail, in `make check`). `slow` tests are
    started first, `quiet` ones last."""
    unmarked = []
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if TESTBED_DIR in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.testbed)
            callspec = getattr(item, "callspec", None)
            in_cluster = callspec is not None and callspec.params.get("deployment") == "in-cluster"
            if fixtures & IN_CLUSTER_FIXTURES or in_cluster:
                item.add_marker(pytest.mark.incluster)
        if fixtures & NEEDS_ROOT and item.get_closest_marker("netns") is None:
            unmarked.append(item.nodeid)
    # the slow ones first (a stable sort): a parallel run then does not end on one of them;
    # the `quiet` ones last: by then make test's unit half, which runs beside the test bed's,
    # has long ended and left them the CPU their measurements assume
    items.sort(
        key=lambda item: (
            item.get_closest_marker("quiet") is not None,
            item.get_closest_marker("slow") is None,
        )
    )
    if unmarked:
        raise pytest.UsageError(
            "these tests use a fixture that needs root but are not marked netns:\n  "
            + "\n  ".join(unmarked)
        )


@pytest.fixture(autouse=True)
def _no_leaked_namespaces() -> Iterator[None]:
    def ours() -> set[str]:
        names = os.listdir("/run/netns") if os.path.isdir("/run/netns") else []
        return {n for n in names if n.startswith("cnidra") and f"-{RUN_TAG}-" in n}

    before = ours()
    yield
    leaked = ours() - before
    assert not leaked, f"namespaces left behind: {leaked}"
