"""Every example Pod lists its claims in its containers: a container that does not is not held
by the container gate (docs/fail-closed.md), and users copy the examples."""

from __future__ import annotations

from pathlib import Path

import yaml

EXAMPLES = Path(__file__).parents[1] / "examples"


def test_every_example_pods_containers_list_its_claims() -> None:
    pods = [
        (path.name, doc)
        for path in sorted(EXAMPLES.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if isinstance(doc, dict) and doc.get("kind") == "Pod"
    ]
    assert pods
    for name, pod in pods:
        claims = {c["name"] for c in pod["spec"].get("resourceClaims", [])}
        for container in pod["spec"]["containers"]:
            listed = {c["name"] for c in (container.get("resources") or {}).get("claims", [])}
            assert listed == claims, f"{name}: container {container['name']} lists {listed}"
