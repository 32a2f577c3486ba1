"""Shared fixtures. Tests that need real plugins install them (cached); nothing is skipped for
want of a tool."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cnidra.cni import netns

ROOT = Path(__file__).parents[1]


@dataclass(frozen=True)
class CNITools:
    plugins: str  # newest reference plugins, built with go install
    debian_plugins: str  # Debian's containernetworking-plugins (1.1.1)
    cnitool: str


@pytest.fixture(scope="session")
def cni_tools() -> CNITools:
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
# on the machine made meanwhile
RUN_TAG = f"t{os.getpid()}"
os.environ[netns.TAG_VARIABLE] = RUN_TAG


@pytest.fixture(autouse=True)
def _no_leaked_namespaces() -> Iterator[None]:
    def ours() -> set[str]:
        names = os.listdir("/run/netns") if os.path.isdir("/run/netns") else []
        return {n for n in names if n.startswith("cnidra") and f"-{RUN_TAG}-" in n}

    before = ours()
    yield
    leaked = ours() - before
    assert not leaked, f"namespaces left behind: {leaked}"
