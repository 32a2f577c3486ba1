"""The driver itself (cnidra.agent.driver.Driver, every part wired as `cnidra driver` wires it)
over a temporary state root and the in-memory apiserver of tests/kube/fakeapi.py, and one pod's
life through it as kubelet, containerd and the claim controller drive it: for counting what a
pod costs the apiserver (tests/status/test_requests_per_pod.py) and the driver's CPU
(bench/pod_cpu.py), without a cluster.

Not started: no gRPC, ttrpc or HTTP server, no slice publisher, no watch (a pod's deletion is
handed to network policy as its watch of every pod would); the status writer runs (`run`).
The CNI plugins are a shell script on the CNI path, exec'd by the real runtime, or in-memory
fakes (`fake_plugins`)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from cnidra._proto.dra.v1 import api_pb2 as dra
from cnidra._proto.nri.v1alpha1 import api_pb2 as nri
from cnidra.agent import driver as agent
from cnidra.agent.settings import DriverSettings
from cnidra.api.nodes import NodeView
from cnidra.cni.runtime import CNIRuntime
from cnidra.util.aio import reap_children_by_pidfd
from tests.kube.fakeapi import DRIVER, NODE, FakeApiserver, a_pod, allocated_claim

ROOT = Path(__file__).parents[1]
NAMESPACE = "pods"
PLUGIN = """#!/bin/sh
cat > /dev/null
if [ "$CNI_COMMAND" = ADD ]; then
  printf '{"cniVersion":"1.0.0","interfaces":[{"name":"%s","sandbox":"%s"}],%s}' \\
    "$CNI_IFNAME" "$CNI_NETNS" '"ips":[{"address":"198.18.161.7/24","interface":0}]'
fi
"""
# what Multus writes for the pod's primary network, during the runtime's CNI ADD: after kubelet
# made the sandbox's annotations from the pod's
MULTUS_ENTRY = {"name": "cbr0", "interface": "eth0", "ips": ["10.0.0.5"], "default": True}
NETWORK_STATUS = "k8s.v1.cni.cncf.io/network-status"


@functools.cache
def _configs() -> str:
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "deviceclass.yaml").read_text()))
    cls = next(d for d in docs if d and d["metadata"]["name"] == "cni.networking.x-k8s.io")
    params = {
        "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
        "kind": "CNIConfig",
        "ifName": "net1",
        "config": {
            "cniVersion": "1.0.0",
            "name": "bench-cnidra",
            "plugins": [
                {
                    "type": "macvlan",
                    "master": "eth1",
                    "mode": "bridge",
                }
            ],
        },
    }
    configs = [
        {"source": "FromClass", "requests": None, "opaque": cls["spec"]["config"][0]["opaque"]},
        {
            "source": "FromClaim",
            "requests": ["dev"],
            "opaque": {"driver": DRIVER, "parameters": params},
        },
    ]
    return json.dumps(configs)


def configs() -> list[dict[str, Any]]:
    """The allocation's configs of bench.pod_ready's cnidra template: the DeviceClass's policy
    (deploy/deviceclass.yaml) and the claim's macvlan CNIConfig (L2: host-local by a claim is
    refused)."""
    loaded: list[dict[str, Any]] = json.loads(_configs())
    return loaded


@dataclass
class Running:
    """A pod of FakeNode's: its name, its claim as kubelet names it, its annotations when its
    sandbox was made, its sandbox now."""

    name: str
    claim: dra.Claim
    annotations: dict[str, str]
    sandbox: nri.PodSandbox | None = None


class NoNft:
    """Policy tables applied nowhere (cnidra.datapath.netpolicy's calls)."""

    def apply(self, netns: str, ruleset: Any, previous: Any = None, *, timeout: float) -> str:
        return ""

    def remove(self, netns: str, table: str = "", *, timeout: float) -> None:
        return None


class FakeNode:
    """The driver over `root` and `api`; `settings` overrides the defaults."""

    def __init__(
        self, root: Path, api: FakeApiserver, *, fake_plugins: bool = False, **settings: Any
    ) -> None:
        from tests.nri.fakes import FakePlugins

        self.api = api
        bin_dir = root / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        plugin = bin_dir / "macvlan"
        plugin.write_text(PLUGIN)
        plugin.chmod(0o755)
        base = DriverSettings(
            node_name=NODE,
            state_dir=root / "state",
            plugins_registry_dir=root / "registry",
            plugins_dir=root / "plugins",
            legacy_cni_dir=root / "legacy",
            cdi_dir=root / "cdi",
            cni_path=[str(bin_dir)],
            cni_conf_dir=root / "net.d",
            nri_socket=str(root / "nri.sock"),
        )
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(agent, "make_client", lambda *args, **kw: api.client())
            self.driver = agent.Driver(replace(base, **settings))
        d = self.driver
        # what the slice publisher would have read: the allocated link eth1, the node on eth0
        d.publisher._view = NodeView(links={"eth1": "eth1"}, protected=frozenset({"eth0"}))
        d.nri.connected.set()  # as when containerd's NRI connection is up
        d.policy.datapath = NoNft()  # the sandboxes' namespaces are not there
        if fake_plugins:
            d.lifecycle.runtime = CNIRuntime(
                [], cache_dir=str(d.layout.cni_cache), exec_=FakePlugins()
            )
        self.hooks = d.nri.hooks

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[FakeNode]:
        """The status writer at work meanwhile; drained before it stops."""
        undo = reap_children_by_pidfd()  # as Driver.start does: no thread a plugin exec'd
        worker = asyncio.create_task(self.driver.status.run())
        try:
            yield self
            async with asyncio.timeout(30):
                await self.driver.status.flushed()
        finally:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
            await self.driver.client.close()  # its session, in its own loop
            if undo is not None:
                undo()

    async def pod(self, i: int, *, multus: bool = False, annotations: bool = True) -> None:
        """Pod `i`'s life with one cnidra interface from a ResourceClaimTemplate, created and
        deleted. `multus`: Multus writes the pod's network-status annotation (its primary
        network's entry) after the sandbox was made; `annotations`: the pod has any."""
        running = await self.start(i, multus=multus, annotations=annotations)
        await self.settle()  # the pod runs a while: what is queued about it is written
        await self.stop(running)

    async def start(self, i: int, *, multus: bool = False, annotations: bool = True) -> Running:
        """The pod and its claim created, the claim prepared, the sandbox made and attached."""
        name, claim = f"p{i}", f"p{i}-dev-x{i}"
        pod_uid, claim_uid = f"pod-uid-{i}", f"claim-uid-{i}"
        given = {"kubectl.kubernetes.io/last-applied-configuration": "{}"} if annotations else {}
        self.api.pods[NAMESPACE, name] = a_pod(NAMESPACE, name, pod_uid, given)
        self.api.claims[NAMESPACE, claim] = allocated_claim(
            NAMESPACE, claim, claim_uid, name, pod_uid, configs()
        )
        ref = dra.Claim(namespace=NAMESPACE, name=claim, uid=claim_uid)
        answer = await self.driver.dra.node_prepare_resources(
            dra.NodePrepareResourcesRequest(claims=[ref]), None
        )
        assert not answer.claims[claim_uid].error, answer.claims[claim_uid].error
        running = Running(name, ref, given)
        if multus:
            meta = self.api.pods[NAMESPACE, name]["metadata"]
            meta.setdefault("annotations", {})[NETWORK_STATUS] = json.dumps([MULTUS_ENTRY])
        await self.sandbox(running, 0)
        return running

    async def sandbox(self, running: Running, n: int) -> nri.PodSandbox:
        """The pod's sandbox `n` made (kubelet copies the pod's annotations into it as they
        were when it made the pod's first) and attached."""
        sandbox = nri.PodSandbox(
            id=f"sandbox-{running.name}-{n}",
            name=running.name,
            namespace=NAMESPACE,
            uid=self.api.pods[NAMESPACE, running.name]["metadata"]["uid"],
        )
        sandbox.annotations.update(running.annotations)
        sandbox.linux.namespaces.add(type="network", path=f"/run/netns/cni-{running.name}-{n}")
        await self.hooks.run_pod_sandbox(sandbox)
        await self.hooks.create_container(sandbox)
        running.sandbox = sandbox
        return sandbox

    async def stop_sandbox(self, running: Running) -> None:
        assert running.sandbox is not None
        await self.hooks.stop_pod_sandbox(running.sandbox)
        await self.hooks.remove_pod_sandbox(running.sandbox)
        running.sandbox = None

    async def stop(self, running: Running) -> None:
        """The pod deleted: its sandbox stopped and removed, the claim unprepared, the pod
        gone, its claim deallocated and deleted by the claim controller."""
        if running.sandbox is not None:
            await self.stop_sandbox(running)
        claim = running.claim
        answer = await self.driver.dra.node_unprepare_resources(
            dra.NodeUnprepareResourcesRequest(claims=[claim]), None
        )
        assert not answer.claims[claim.uid].error, answer.claims[claim.uid].error
        pod = self.api.pods.pop((NAMESPACE, running.name))
        # what network policy's watch of every pod brings in a cluster (none runs here): else
        # the pods it knows only grow, and each attach's tables are built over all of them
        self.driver.policy.changed("Pod", "DELETED", pod)
        self.api.deallocate(NAMESPACE, claim.name)
        self.api.delete_claim(NAMESPACE, claim.name)

    async def settle(self) -> None:
        """Until the status writer has written what is due now (not what waits on purpose)."""
        status = self.driver.status
        for _ in range(3000):  # 30 s at least: a bound for a hang, not for a slow machine
            if (
                not status.events.pending()
                and not status.pods.pending()
                and not any(
                    at == 0.0 for (kind, _), at in status.queue.due_times.items() if kind == "claim"
                )
            ):
                return
            await asyncio.sleep(0.01)  # seldom: each look is CPU the driver does not spend
        raise AssertionError("the status writer did not settle")
