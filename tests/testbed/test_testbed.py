"""Proof that the test bed is a real Kubernetes: real kubelet, containerd, scheduler and DRA."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Any

import pytest

from testbed.harness import Cluster
from tests.testbed.objects import env_image, pod

pytestmark = pytest.mark.testbed
FAKE_DRIVER = "testbed.cnidra.local"  # no driver of ours: the DRA path alone


def test_plain_pod_runs_with_a_primary_address_and_is_deleted_cleanly(
    cluster: Cluster, namespace: str
) -> None:
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input_=json.dumps(pod("plain", env_image()))
    )
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "pod/plain", "--timeout=90s")
    obj = cluster.get("pod", "plain", namespace)
    assert obj["spec"]["nodeName"] == "testbed-node"
    assert ipaddress.ip_address(obj["status"]["podIP"]) in ipaddress.ip_network("198.18.128.0/24")
    shown = cluster.kubectl(
        "exec", "-n", namespace, "plain", "--", "ip", "-4", "addr", "show", "eth0"
    )
    assert obj["status"]["podIP"] in shown.stdout

    sandboxes = json.loads(cluster.crictl("pods", "--namespace", namespace, "-o", "json").stdout)
    [sandbox] = [s for s in sandboxes["items"] if s["metadata"]["name"] == "plain"]
    info = json.loads(cluster.crictl("inspectp", sandbox["id"]).stdout)
    [netns] = [
        n["path"]
        for n in info["info"]["runtimeSpec"]["linux"]["namespaces"]
        if n["type"] == "network"
    ]
    assert netns.startswith(cluster.env["TESTBED_ROOT"])  # netns_mounts_under_state_dir
    assert Path(netns).exists()

    cluster.kubectl("delete", "-n", namespace, "pod", "plain", "--wait=true", "--timeout=60s")

    def sandbox_stopped() -> bool:
        # stopped (NOTREADY: its network torn down, its netns removed) or already removed;
        # kubelet's garbage collection removes stopped sandboxes a minute or so later
        left = json.loads(cluster.crictl("pods", "--namespace", namespace, "-o", "json").stdout)
        mine = [s for s in left["items"] if s["metadata"]["name"] == "plain"]
        return all(s["state"] == "SANDBOX_NOTREADY" for s in mine)

    cluster.wait("kubelet to stop the sandbox", sandbox_stopped, 90)
    assert not Path(netns).exists()


def test_dra_allocation_without_our_driver_waits_for_the_driver(
    cluster: Cluster, namespace: str
) -> None:
    slice_name = f"testbed-fake-{namespace}"
    cluster.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": slice_name},
            "spec": {
                "driver": FAKE_DRIVER,
                "nodeName": "testbed-node",
                "pool": {"name": f"pool-{namespace}", "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "thing0", "attributes": {"color": {"string": "blue"}}}],
            },
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": f"fake-{namespace}"},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{FAKE_DRIVER}"'}}]},
        },
    )
    try:
        template: dict[str, Any] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "thing"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "t", "exactly": {"deviceClassName": f"fake-{namespace}"}}
                        ]
                    }
                }
            },
        }
        consumer = pod(
            "consumer",
            env_image(),
            resourceClaims=[{"name": "thing", "resourceClaimTemplateName": "thing"}],
        )
        consumer["spec"]["containers"][0]["resources"] = {"claims": [{"name": "thing"}]}
        cluster.kubectl(
            "apply",
            "-n",
            namespace,
            "-f",
            "-",
            input_=json.dumps(template) + "\n---\n" + json.dumps(consumer),
        )

        def allocated() -> dict[str, Any] | None:
            claims = json.loads(
                cluster.kubectl("get", "resourceclaims", "-n", namespace, "-o", "json").stdout
            )["items"]
            done = [c for c in claims if (c.get("status") or {}).get("allocation")]
            return done[0] if done else None

        claim = cluster.wait("the scheduler to allocate the claim", allocated, 60)
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"], result["device"]) == (
            FAKE_DRIVER,
            f"pool-{namespace}",
            "thing0",
        )
        assert claim["metadata"]["ownerReferences"][0]["name"] == "consumer"

        def waiting_for_driver() -> list[str]:
            return [
                e["message"]
                for e in cluster.events("consumer", namespace)
                if FAKE_DRIVER in e.get("message", "")
            ]

        messages = cluster.wait("kubelet to report the missing driver", waiting_for_driver, 60)
        assert any("not registered" in m or "driver" in m for m in messages), messages
        phase = cluster.get("pod", "consumer", namespace)["status"]["phase"]
        assert phase == "Pending"
    finally:
        cluster.kubectl("delete", "resourceslice", slice_name, check=False)
        cluster.kubectl("delete", "deviceclass", f"fake-{namespace}", check=False)
