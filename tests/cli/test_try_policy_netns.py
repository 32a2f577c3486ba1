"""`cnidra try --policy` runs what prepare allows, as prepare binds and names it; without
--policy it says the class's CNIPolicy was not judged (root, network namespaces)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cni.test_try import (  # noqa: F401  (fixtures: a machine of its own for each test)
    clean_machine,
    cnidra_try,
    machine,
)
from tests.conftest import CNITools

pytestmark = pytest.mark.netns
ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples"
POLICY = str(ROOT / "deploy" / "deviceclass.yaml")


@pytest.mark.usefixtures("clean_machine")
def test_what_the_class_allows_runs_judged(cni_tools: CNITools) -> None:
    example = str(EXAMPLES / "macvlan-claim.yaml")
    judged = cnidra_try(cni_tools, "--policy", POLICY, "-o", "json", example)
    assert judged.returncode == 0, judged.stderr
    [device] = json.loads(judged.stdout)["status"]["devices"]
    assert device["networkData"]["ips"] and "not judged:" not in judged.stderr
    unjudged = cnidra_try(cni_tools, example)
    assert unjudged.returncode == 0, unjudged.stderr
    assert "not judged:" in unjudged.stderr and "--policy" in unjudged.stderr
