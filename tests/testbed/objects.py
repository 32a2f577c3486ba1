"""What the test bed's tests are made of: a tenant's network config, claim templates, pods that
claim them, and reading what a pod got. Shared by the modules (none imports another's tests)."""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

from testbed import cluster as tb
from testbed.harness import Cluster

DRIVER = "cni.dra.networking.x-k8s.io"


# the tests' containers: a PID 1 that exits on SIGTERM. `sleep` as PID 1 ignores it, so every
# deletion sat out the grace period and kubelet's kill: 5.0 s a pod, 1.4 s with this (measured
# on the test bed, one pod, `kubectl delete`)
SLEEP = ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]


def pod(name: str, image: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": image, "command": SLEEP}],
            **spec,
        },
    }


def env_image() -> str:
    return os.environ.get("TESTBED_IMAGE", tb.TEST_IMAGE)


# An admin's class for the tests' own fault plugins, which the default class's policy does not
# list (a claim may use a plugin only by a policy's leave).
TEST_CLASS = "testplugins.cni.networking.x-k8s.io"


def admin_class(name: str, claims: dict[str, Any]) -> dict[str, Any]:
    """An admin's DeviceClass for cnidra's devices whose CNIPolicy allows claims `claims`."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {
            "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}],
            "config": [
                {
                    "opaque": {
                        "driver": DRIVER,
                        "parameters": {
                            "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
                            "kind": "CNIPolicy",
                            "claims": claims,
                        },
                    }
                }
            ],
        },
    }


def plugins_class() -> dict[str, Any]:
    return admin_class(
        TEST_CLASS,
        {
            "defineNetworks": True,
            "plugins": ["macvlan", "cnidra", "fault-del-fails", "tb-sleepy"],
            # the test plugins' own fields, opened by name (a claim may set only fields cnidra
            # knows unless the admin opens them)
            "pluginFields": {"fault-del-fails": ["failDelWhile"]},
        },
    )


def cni_config(name: str, parent: str, pool: str) -> dict[str, Any]:
    """A tenant's macvlan network addressed from cnidra's cluster IPAM: `pool` is a CNIIPPool
    serving the claim's namespace (the `ip_pools` fixture makes one). host-local written by a
    claim is refused (cnidra.api.policy.SEGMENT_BLIND_IPAM)."""
    return {
        "cniVersion": "1.1.0",
        "name": name,
        "plugins": [
            {
                "type": "macvlan",
                "master": parent,
                "mode": "bridge",
                "ipam": {"type": "cnidra", "pool": pool},
            }
        ],
    }


def select_link(link: str) -> str:
    return f'device.attributes["{DRIVER}"].ifName == "{link}"'


def device_template(
    name: str, device_class: str, requests: list[tuple[str, str, dict[str, Any] | None]]
) -> dict[str, Any]:
    """A ResourceClaimTemplate: (request, CEL selector, CNIConfig fields or None) per request."""
    devices: dict[str, Any] = {
        "requests": [
            {
                "name": req,
                "exactly": {
                    "deviceClassName": device_class,
                    "selectors": [{"cel": {"expression": selector}}],
                },
            }
            for req, selector, _ in requests
        ]
    }
    config = [
        {
            "requests": [req],
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
                    "kind": "CNIConfig",
                    **fields,
                },
            },
        }
        for req, _, fields in requests
        if fields is not None
    ]
    if config:
        devices["config"] = config
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": devices}},
    }


def template(
    name: str,
    requests: list[tuple[str, str, dict[str, Any], str]],
    device_class: str = "cni.networking.x-k8s.io",
) -> dict[str, Any]:
    """requests: (request name, parent link, CNI config, ifName)."""
    return device_template(
        name,
        device_class,
        [
            (req, select_link(link), {"ifName": if_name, "config": conf})
            for req, link, conf, if_name in requests
        ],
    )


def claiming_pod(name: str, *templates: str) -> dict[str, Any]:
    spec = pod(
        name,
        env_image(),
        resourceClaims=[{"name": t, "resourceClaimTemplateName": t} for t in templates],
    )
    spec["spec"]["containers"][0]["resources"] = {"claims": [{"name": t} for t in templates]}
    return spec


def apply(cluster: Cluster, namespace: str, *docs: dict[str, Any]) -> None:
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input_="\n---\n".join(json.dumps(d) for d in docs)
    )


def pod_addresses(cluster: Cluster, namespace: str, name: str, if_name: str) -> set[str]:
    """The interface's IPv4 addresses; empty only when the pod says it has no such interface.
    `kubectl exec` fails for a while after a runtime restart: that is retried, never read as
    "no interface"."""
    deadline = time.monotonic() + 60
    while True:
        out = cluster.kubectl(
            "exec", "-n", namespace, name, "--", "ip", "addr", "show", if_name, check=False
        )
        if out.returncode == 0:
            return set(re.findall(r"inet (\S+) ", out.stdout))
        if "can't find device" in out.stderr or "does not exist" in out.stderr:
            return set()
        if time.monotonic() > deadline:
            raise AssertionError(f"kubectl exec into {namespace}/{name} failed: {out.stderr}")
        time.sleep(1)


def claims_of(cluster: Cluster, namespace: str, pod_name: str) -> list[dict[str, Any]]:
    items = json.loads(
        cluster.kubectl("get", "resourceclaims", "-n", namespace, "-o", "json").stdout
    )["items"]
    return [
        c
        for c in items
        if any(o["name"] == pod_name for o in c["metadata"].get("ownerReferences", []))
    ]


def ready(cluster: Cluster, namespace: str, name: str, timeout: str = "90s") -> None:
    cluster.kubectl(
        "wait",
        "-n",
        namespace,
        "--for=condition=Ready",
        f"pod/{name}",
        f"--timeout={timeout}",
        timeout=150,
    )
