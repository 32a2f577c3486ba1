"""Every example is real: it passes `cnidra validate` with the classes the chart ships
(deploy/deviceclass.yaml, the one source), names no node-specific link, and the README shows a
pod with its claim. tests/cni/test_try.py runs the claims with the real plugins;
tests/testbed/test_examples.py runs the README's on the test bed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
SHIPPED = ROOT / "deploy" / "deviceclass.yaml"
PARENTS = {"master", "bridge", "device"}


def walk(value: Any) -> Any:
    if isinstance(value, dict):
        for key, child in value.items():
            yield key, child
            yield from walk(child)
    elif isinstance(value, list):
        for child in value:
            yield from walk(child)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_each_example_passes_validate_with_the_shipped_classes(path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cnidra", "validate", "--policy", str(SHIPPED), str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "is not checked" not in result.stdout  # every class it uses is known


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_no_example_names_a_nodes_link(path: Path) -> None:
    """Links are chosen by attribute; prepare fills the allocated one in."""
    for doc in yaml.safe_load_all(path.read_text()):
        for key, value in walk(doc):
            if key == "config" and isinstance(value, str):
                parsed = yaml.safe_load(value)
                assert not [k for k, _ in walk(parsed) if k in PARENTS], path
            assert key not in PARENTS, f"{path.name} names a link in {key!r}"


def test_one_source_for_the_classes() -> None:
    """No drifting copy of the chart's classes among the examples."""
    for path in EXAMPLES:
        kinds = [d.get("kind") for d in yaml.safe_load_all(path.read_text()) if d]
        classes = [
            d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "DeviceClass"
        ]
        assert all(c["metadata"]["name"] != "cni.networking.x-k8s.io" for c in classes), kinds


def test_the_readme_shows_a_pod_with_its_claim() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", readme, re.S)
    docs = [d for block in blocks for d in yaml.safe_load_all(block) if isinstance(d, dict)]
    templates = {d["metadata"]["name"] for d in docs if d.get("kind") == "ResourceClaimTemplate"}
    pods = [d for d in docs if d.get("kind") == "Pod"]
    assert pods and templates
    used = {c.get("resourceClaimTemplateName") for p in pods for c in p["spec"]["resourceClaims"]}
    assert used & templates


def test_the_readme_example_takes_its_addresses_as_the_example_file_does() -> None:
    """The README's first example is examples/macvlan-claim.yaml in short: the same admin's
    CNIIPPool before the claim template, and the template's macvlan addressed from it (a
    claim's own host-local is refused: cnidra/api/policy.py SEGMENT_BLIND_IPAM)."""
    readme = (ROOT / "README.md").read_text()
    first = re.findall(r"```yaml\n(.*?)```", readme, re.S)[0]
    shown = [d for d in yaml.safe_load_all(first) if d]
    example = list(yaml.safe_load_all((ROOT / "examples" / "macvlan-claim.yaml").read_text()))
    assert [d["kind"] for d in shown] == [d["kind"] for d in example]
    assert [d["kind"] for d in example] == ["CNIIPPool", "ResourceClaimTemplate", "Pod"]
    assert shown[0] == example[0]

    def ipam(template: dict[str, Any]) -> Any:
        [config] = template["spec"]["spec"]["devices"]["config"]
        return config["opaque"]["parameters"]["config"]["plugins"][0]["ipam"]

    assert ipam(shown[1]) == ipam(example[1]) == {"type": "cnidra", "pool": "data"}
