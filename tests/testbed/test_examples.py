"""The README's example on the test bed, as a new user applies it: the shipped classes, the
driver with deploy/'s defaults, the example's claim template and pod as they are except for
two things the test bed cannot have: its data links are host-only bridges standing in for NICs
(type "bridge", not "physical"), so the selector asks for the test's own link, and its image is
the test bed's busybox."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from cnidra.state.layout import DEFAULT_STATE_ROOT
from testbed.harness import ROOT, Cluster, DriverProcess
from tests.testbed.conftest import env_image
from tests.testbed.test_lifecycle import pod_addresses, ready

pytestmark = pytest.mark.testbed
DRIVER = "cni.dra.networking.x-k8s.io"


def test_the_readme_example_runs_with_the_shipped_defaults(
    cluster: Cluster, namespace: str, test_link: Callable[[str], str], tmp_path: Path
) -> None:
    link = test_link(f"tbex{uuid.uuid4().hex[:5]}")
    cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "deviceclass.yaml"))
    cluster.kubectl("label", "namespace", namespace, "cni.networking.x-k8s.io/claim-config=true")
    template, pod = list(yaml.safe_load_all((ROOT / "examples" / "macvlan-claim.yaml").read_text()))
    [request] = template["spec"]["spec"]["devices"]["requests"]
    [selector] = request["exactly"]["selectors"]
    assert '.type == "physical"' in selector["cel"]["expression"]
    selector["cel"]["expression"] = f'device.attributes["{DRIVER}"].ifName == "{link}"'
    pod["spec"]["containers"] = [
        {"name": "app", "image": env_image(), "command": ["sleep", "3600"]}
    ]
    pod["spec"]["terminationGracePeriodSeconds"] = 1
    driver = DriverProcess(cluster, tmp_path, defaults=True)  # as deploy/ runs it
    try:
        driver.start()
        cluster.wait("the NRI plugin to connect", lambda: driver.health().get("nriConnected"), 60)
        cluster.apply_in(namespace, template)
        cluster.apply_in(namespace, pod)
        ready(cluster, namespace, pod["metadata"]["name"])
        [address] = pod_addresses(cluster, namespace, pod["metadata"]["name"], "net1")
        assert address.startswith("198.18.10.")

        def listed() -> bool:
            meta = cluster.get("pod", pod["metadata"]["name"], namespace)["metadata"]
            text = (meta.get("annotations") or {}).get("k8s.v1.cni.cncf.io/network-status")
            return any(e.get("interface") == "net1" for e in json.loads(text or "[]"))

        cluster.wait("net1 in the pod's network-status annotation", listed, 30)
    finally:
        cluster.kubectl(
            "delete", "pods", "--all", "-n", namespace, "--timeout=90s", check=False, timeout=120
        )
        driver.stop()
        shutil.rmtree(DEFAULT_STATE_ROOT, ignore_errors=True)
