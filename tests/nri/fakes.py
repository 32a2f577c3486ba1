"""Named fakes for the pod lifecycle: plugins that answer from memory, pods as NRI sends them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cnidra._proto.nri.v1alpha1 import api_pb2 as nri
from cnidra.api.bandwidth import Rate, Terms
from cnidra.api.ownership import owned_network, owned_network_name
from cnidra.api.refs import ObjectRef
from cnidra.cni.attach import Attachment
from cnidra.cni.errors import PluginError, PluginTimeout
from cnidra.cni.invoke import Deadline, Invocation, PluginExec
from cnidra.cni.runtime import CNIRuntime
from cnidra.datapath.shaping import InterfaceNotFound, ShapingError
from cnidra.nri.bandwidth import BandwidthKeeper
from cnidra.nri.hooks import PodHooks
from cnidra.nri.lifecycle import HookBudget, PodLifecycle, PolicyHook
from cnidra.nri.reconcile import Reconciler
from cnidra.state.checkpoint import Checkpoint, PreparedClaim
from cnidra.state.journal import Journal
from cnidra.state.layout import StateLayout
from cnidra.state.sandboxes import SandboxStore
from cnidra.status.devices import Condition, DeviceStatus, NetworkStatus
from cnidra.status.writer import SeenAnnotations
from cnidra.util.backoff import Backoff
from cnidra.util.locks import KeyedLocks


@dataclass(frozen=True)
class Call:
    plugin: str
    command: str
    container_id: str
    if_name: str
    network: str
    netns: str = ""


class Crash(BaseException):
    """The driver process dying at this point: nothing after it runs."""


@dataclass
class FakePlugins(PluginExec):
    """Plays every plugin: records each call, answers ADD with one address. `slow` plugins
    sleep that long on ADD (and honour the deadline as the real exec does); `failing` fail
    the commands named (e.g. {"macvlan": "DEL"}); `crash_at` (command, n) makes the n-th call
    of that command kill the "process" before the plugin runs."""

    calls: list[Call] = field(default_factory=list)
    slow: dict[str, float] = field(default_factory=dict)
    failing: dict[str, str] = field(default_factory=dict)
    crash_at: tuple[str, int] | None = None
    timeout: float = 10.0
    # plugin types whose ADD hands over a device bound to a userspace driver (DPDK): their
    # result lists no interface and no address, as sriov-cni's in DPDK mode
    userspace: set[str] = field(default_factory=set)

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
        if self.crash_at and self.crash_at[0] == invocation.command:
            seen = len(self.commands(invocation.command))
            if seen + 1 == self.crash_at[1]:
                self.crash_at = None
                raise Crash(f"crashed before {invocation.command} #{seen + 1}")
        self.calls.append(
            Call(
                plugin_type,
                invocation.command,
                invocation.container_id,
                invocation.if_name,
                conf.get("name", ""),
                invocation.netns,
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
        if plugin_type in self.userspace:
            return {"cniVersion": conf["cniVersion"]}
        return {
            "cniVersion": conf["cniVersion"],
            "interfaces": [{"name": invocation.if_name, "sandbox": invocation.netns}],
            "ips": [{"address": "198.18.0.2/24", "interface": 0}],
        }

    def commands(self, command: str) -> list[Call]:
        return [c for c in self.calls if c.command == command]


def runtime(tmp_path: Path, plugins: FakePlugins) -> CNIRuntime:
    return CNIRuntime([], cache_dir=str(StateLayout(tmp_path).cni_cache), exec_=plugins)


# the pause pid of a hostNetwork pod: its /proc namespace is the node's
NODE_PAUSE_PID = 1
NODE_NETNS = f"/proc/{NODE_PAUSE_PID}/ns/net"


def pod(
    name: str, uid: str | None = None, sandbox: str | None = None, *, pid: int = 0
) -> nri.PodSandbox:
    """A pod as NRI sends it; with `pid`, as containerd sends a sandbox it recovered after
    dying mid-creation: no spec, so no network namespace path, only the pause pid."""
    sandbox = sandbox or f"{name}-sandbox"
    p = nri.PodSandbox(id=sandbox, name=name, namespace="ns", uid=uid or f"{name}-uid", pid=pid)
    if not pid:
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
    checkpoint: Checkpoint,
    claim: str,
    pod_uids: str | tuple[str, ...],
    *devices: tuple[str, Mapping[str, Any]],
    on_demand: bool = False,
    rate: Rate | None = None,
    policy_network: str = "",
    bandwidth: Terms | None = None,
    parent: str = "",
) -> PreparedClaim:
    """Checkpoint a claim for one pod or several (a shared claim): devices are (ifName,
    network); `on_demand`: plugged through the node API, not at sandbox start; `rate`: the
    rate limit every device is held to; `bandwidth`: what it is decided from (the rate is then
    what prepare decides: `bandwidth.decide()`), on link `parent`."""
    ref = ObjectRef("ns", claim, f"{claim}-uid")
    prepared = PreparedClaim(
        ref,
        (pod_uids,) if isinstance(pod_uids, str) else pod_uids,
        tuple(
            Attachment(
                ref,
                f"req{i}",
                if_name,
                net,
                "node",
                f"dev{i}",
                network_label=str(net["name"]).rsplit(".", 1)[-1],
                on_demand=on_demand,
                rate=bandwidth.decide() if bandwidth is not None else rate,
                policy_network=policy_network,
                bandwidth=bandwidth,
                parent=parent,
            )
            for i, (if_name, net) in enumerate(devices)
        ),
    )
    checkpoint.put_blocking(prepared)
    return prepared


@dataclass
class FakeShaper:
    """Rate limits kept in memory, by (netns, interface), with every call made; `failing`:
    (operation, interface) pairs that raise ShapingError, `gone`: interfaces remove finds
    Gone."""

    limits: dict[tuple[str, str], Rate] = field(default_factory=dict)
    calls: list[tuple[str, str, str, float]] = field(default_factory=list)
    failing: set[tuple[str, str]] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)

    def apply(self, netns: str, interface: str, limit: Rate, *, timeout: float) -> object:
        self.calls.append(("apply", netns, interface, timeout))
        if ("apply", interface) in self.failing:
            raise ShapingError(f"shaping {interface} to {limit} in {netns}: RTNETLINK said no")
        self.limits[(netns, interface)] = limit
        return limit

    def remove(self, netns: str, interface: str, *, timeout: float) -> bool:
        self.calls.append(("remove", netns, interface, timeout))
        if interface in self.gone:
            raise InterfaceNotFound(f"{interface} is not in {netns}")
        if ("remove", interface) in self.failing:
            raise ShapingError(f"removing the limit of {interface}: RTNETLINK said no")
        return self.limits.pop((netns, interface), None) is not None


class RecordingStatus:
    """A StatusSink that keeps what it was told."""

    def __init__(self) -> None:
        self.entries: dict[ObjectRef, dict[tuple[str, ...], dict[str, Any]]] = {}
        self.finalizers: dict[ObjectRef, bool] = {}
        self.events: list[tuple[ObjectRef, str, str]] = []
        self.event_types: list[str] = []
        self.event_details: list[bool] = []
        self.networks: dict[ObjectRef, Sequence[NetworkStatus]] = {}
        self.seen: dict[ObjectRef, SeenAnnotations | None] = {}
        self.gone: list[ObjectRef] = []
        self.released_claims: list[tuple[ObjectRef, bool]] = []
        # (claim, pool, device, share) -> condition type -> the condition
        self.conditions: dict[tuple[ObjectRef, str, str, str], dict[str, Condition]] = {}

    def put(self, claim: ObjectRef, status: DeviceStatus) -> None:
        self.entries.setdefault(claim, {})[status.key[1:]] = status.entry()

    def drop(
        self, claim: ObjectRef, keys: list[tuple[str, str, str, str]], *, later: bool = False
    ) -> None:
        for _, pool, device, share in keys:
            self.entries.get(claim, {}).pop((pool, device, share), None)

    def finalizer(self, claim: ObjectRef, present: bool) -> None:
        self.finalizers[claim] = present

    def device_condition(
        self,
        claim: ObjectRef,
        key: tuple[str, str, str, str],
        type_: str,
        condition: Condition | None,
    ) -> None:
        held = self.conditions.setdefault((claim, *key[1:]), {})
        if condition is None:
            held.pop(type_, None)
        else:
            held[type_] = condition

    def event(
        self,
        pod: ObjectRef,
        reason: str,
        message: str,
        type_: str = "Warning",
        *,
        detail: bool = False,
    ) -> None:
        self.events.append((pod, reason, message))
        self.event_types.append(type_)
        self.event_details.append(detail)

    def released(self, claim: ObjectRef, generated: bool) -> None:
        self.released_claims.append((claim, generated))

    def pod_networks(
        self,
        pod: ObjectRef,
        statuses: Sequence[NetworkStatus],
        seen: SeenAnnotations | None = None,
    ) -> None:
        self.networks[pod] = statuses
        self.seen[pod] = seen

    def pod_gone(self, pod: ObjectRef) -> None:
        self.gone.append(pod)


@dataclass
class Node:
    """The node side of cnidra over one state root, as the driver wires it."""

    lifecycle: PodLifecycle
    reconciler: Reconciler
    hooks: PodHooks
    plugins: FakePlugins
    status: RecordingStatus
    gone: set[str]  # network namespaces that no longer exist
    keeper: BandwidthKeeper | None = None  # with Node.start(bandwidth=True)

    @classmethod
    def start(
        cls,
        root: Path,
        plugins: FakePlugins | None = None,
        gone: set[str] | None = None,
        journal: Journal | None = None,
        background: bool = False,
        hold_from_attach: bool = False,
        shaper: FakeShaper | None = None,
        policy: PolicyHook | None = None,
        bandwidth: bool = False,
    ) -> Node:
        """A fresh process over `root`: what is on disk is all it knows."""
        plugins = plugins or FakePlugins()
        gone = set() if gone is None else gone
        layout = StateLayout(root)
        status = RecordingStatus()
        store = SandboxStore(layout)
        checkpoint = Checkpoint(layout)
        shaper = shaper if shaper is not None else FakeShaper()
        keeper = None
        if bandwidth:  # as the driver wires it (cnidra.agent.driver)
            keeper = BandwidthKeeper(
                store, status, KeyedLocks(), shaper=shaper, checkpoint=checkpoint
            )
            keeper.replace_classes([])  # the DeviceClass LIST: none yet
        lifecycle = PodLifecycle(
            checkpoint,
            runtime(root, plugins),
            store,
            status,
            retry=lambda: Backoff(0.01, 0.05, jitter=0),
            netns_exists=lambda path: path not in gone,
            node_netns=lambda path: path == NODE_NETNS,
            budget=HookBudget(attach=0.3, request_timeout=1.0),
            max_attachments=3,
            journal=journal,
            hold_from_attach=hold_from_attach,
            shaper=shaper,
            policy=policy,
            bandwidth=keeper,
            locks=keeper.locks if keeper is not None else None,
        )
        reconciler = Reconciler(lifecycle, layout.write_problem)
        hooks = PodHooks(lifecycle, reconciler, background=background)
        return cls(lifecycle, reconciler, hooks, plugins, status, gone, keeper)

    @property
    def store(self) -> SandboxStore:
        return self.lifecycle.store

    @property
    def checkpoint(self) -> Checkpoint:
        return self.lifecycle.checkpoint

    async def settle(self) -> None:
        """Wait until no detach is queued to be tried again (up to 30 s: a bound for a hang)."""
        for _ in range(3000):
            if not self.lifecycle.detaches:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"detaches still queued: {list(self.lifecycle.detaches)}")
