"""Named fakes for the pod lifecycle: plugins that answer from memory, pods as NRI sends them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cnidra._proto.nri.v1alpha1 import api_pb2 as nri
from cnidra.api.ownership import owned_network, owned_network_name
from cnidra.cni.errors import PluginError, PluginTimeout
from cnidra.cni.invoke import Deadline, Invocation, PluginExec
from cnidra.cni.runtime import CNIRuntime
from cnidra.state.checkpoint import Checkpoint, PreparedClaim, PreparedDevice
from cnidra.state.layout import StateLayout


@dataclass(frozen=True)
class Call:
    plugin: str
    command: str
    container_id: str
    if_name: str
    network: str


@dataclass
class FakePlugins(PluginExec):
    """Plays every plugin: records each call, answers ADD with one address. `slow` plugins
    sleep that long on ADD (and honour the deadline as the real exec does); `failing` fail."""

    calls: list[Call] = field(default_factory=list)
    slow: dict[str, float] = field(default_factory=dict)
    failing: dict[str, str] = field(default_factory=dict)
    timeout: float = 10.0

    def __post_init__(self) -> None:
        self.cni_path = []
        self.base_env = {}
        self._found = {}

    async def run(
        self,
        plugin_type: str,
        invocation: Invocation,
        stdin: bytes,
        deadline: Deadline | None = None,
    ) -> Any:
        conf = json.loads(stdin)
        self.calls.append(
            Call(
                plugin_type,
                invocation.command,
                invocation.container_id,
                invocation.if_name,
                conf.get("name", ""),
            )
        )
        if invocation.command == "ADD" and plugin_type in self.slow:
            limit = self.timeout if deadline is None else min(self.timeout, deadline.remaining())
            if limit < self.slow[plugin_type]:
                await asyncio.sleep(max(limit, 0))
                raise PluginTimeout(
                    plugin_type, "ADD", limit, deadline.describe() if deadline else ""
                )
            await asyncio.sleep(self.slow[plugin_type])
        if invocation.command in self.failing.get(plugin_type, ""):
            raise PluginError.create(plugin_type, invocation.command, 11, "it broke", "", b"")
        if invocation.command != "ADD":
            return None
        return {
            "cniVersion": conf["cniVersion"],
            "interfaces": [{"name": invocation.if_name, "sandbox": invocation.netns}],
            "ips": [{"address": "198.18.0.2/24", "interface": 0}],
        }

    def commands(self, command: str) -> list[Call]:
        return [c for c in self.calls if c.command == command]


def runtime(tmp_path: Path, plugins: FakePlugins) -> CNIRuntime:
    return CNIRuntime([], cache_dir=str(StateLayout(tmp_path).cni_cache), exec_=plugins)


def pod(name: str, uid: str | None = None, sandbox: str | None = None) -> nri.PodSandbox:
    sandbox = sandbox or f"{name}-sandbox"
    p = nri.PodSandbox(id=sandbox, name=name, namespace="ns", uid=uid or f"{name}-uid")
    p.linux.namespaces.add(type="network", path=f"/run/netns/{sandbox}")
    return p


def network(label: str, *plugins: str, namespace: str = "ns") -> Mapping[str, Any]:
    conflist = {
        "cniVersion": "1.1.0",
        "name": label,
        "plugins": [{"type": p} for p in plugins],
    }
    dirs = StateLayout(Path("/state")).private_dirs()
    return owned_network(conflist, owned_network_name(label, namespace), dirs)


def prepare(
    checkpoint: Checkpoint, claim: str, pod_uid: str, *devices: tuple[str, Mapping[str, Any]]
) -> PreparedClaim:
    """Checkpoint a claim for a pod: devices are (ifName, network)."""
    prepared = PreparedClaim(
        f"{claim}-uid",
        "ns",
        claim,
        (pod_uid,),
        tuple(
            PreparedDevice(
                f"req{i}",
                "node",
                f"dev{i}",
                if_name,
                net,
                network_label=str(net["name"]).rsplit(".", 1)[-1],
            )
            for i, (if_name, net) in enumerate(devices)
        ),
    )
    checkpoint.put(prepared)
    return prepared
