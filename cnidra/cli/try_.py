"""`cnidra try`: do for one claim what the driver does for a pod, on this machine.

Safe by default: plugins run in a throwaway "node" network namespace with stand-in links for
the host interfaces the config names, host-local keeps its allocations in a scratch directory,
and the result cache lives there too. `--host` runs against the real host instead."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cnidra.api.issues import Issues
from cnidra.api.ownership import owned_network
from cnidra.api.refs import ObjectRef
from cnidra.api.validate import DocumentReport
from cnidra.cni import netns
from cnidra.cni.attach import AttachFailed, Attachment, Outcome, attach_all, detach_all
from cnidra.cni.runtime import CNIRuntime
from cnidra.dra.resolve import Device, attachment_from
from cnidra.state.layout import StateLayout
from cnidra.status.devices import device_status

TRY_NAMESPACE = "cnidra-try"
# --host keeps its CNI cache and IPAM pools here, beside (never inside) the driver's state
HOST_LAYOUT = StateLayout(Path("/var/lib/cnidra/try"))
TRY_CONTAINER = "cnidra-try"
PARENT_FIELDS = {"macvlan": "master", "ipvlan": "master", "vlan": "master", "host-device": "device"}
SAFE_POOL = "cnidra-try"
ALLOCATED = "allocated"  # allocated0, 1, ...: stand-ins for the links the scheduler would pick


@dataclass
class TryPlan:
    attachments: list[Attachment]
    host: bool
    keep: bool
    pod_netns: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class TryResult:
    outcomes: list[Outcome]
    ok: bool
    statuses: list[dict[str, Any]]
    kept: list[str] = field(default_factory=list)
    cleanup_errors: list[str] = field(default_factory=list)


class NoParent(ValueError):
    """A config that leaves its parent link to the allocation, tried on the real host."""


def plan_attachments(
    reports: Sequence[DocumentReport], pool: str, *, host: bool = False
) -> list[Attachment]:
    """What the driver would attach, made the driver's way (`attachment_from`), for a pod
    `cnidra-try` in namespace `cnidra-try`, state under the --host state root. A config that
    names no parent link (the claim selects its link by attribute and prepare fills the
    allocated one in) is bound to a stand-in link (allocated0, ...) in the throwaway node; on the
    real host there is no allocation to take it from (NoParent)."""
    out: list[Attachment] = []
    pod = ObjectRef(TRY_NAMESPACE, TRY_NAMESPACE, str(uuid.uuid4()))
    stand_ins = 0
    for report in reports:
        claim = ObjectRef(TRY_NAMESPACE, report.name or f"{report.kind}-{report.index}", "")
        for resolved in report.resolved:
            config = resolved.config.config
            assert config is not None
            link = None
            missing = unnamed_parent(config)
            if missing:
                if host:
                    raise NoParent(
                        f"request {resolved.request!r} leaves {missing} to the link the "
                        "scheduler allocates; with --host, name the host link in the config"
                    )
                link = f"{ALLOCATED}{stand_ins}"
                stand_ins += 1
            device = Device(pool, device_name(config) if link is None else link, link=link)
            issues = Issues()
            attachment = attachment_from(
                resolved, claim, device, HOST_LAYOUT.private_dirs(), issues
            )
            if attachment is None:
                raise NoParent("; ".join(f"{i.path}: {i.message}" for i in issues.errors))
            out.append(attachment.for_pod(pod, TRY_CONTAINER))
    return out


def unnamed_parent(config: Mapping[str, Any]) -> str | None:
    """The parent field (e.g. `macvlan.master`) of a plugin that takes one and names none (a
    bridge plugin names its bridge, which it makes when missing)."""
    plugins = config.get("plugins") or [config]
    for plugin in plugins:
        field = {**PARENT_FIELDS, "bridge": "bridge"}.get(str(plugin.get("type")))
        if field and not plugin.get(field):
            return f"{plugin.get('type')}.{field}"
    return None


def device_name(config: Mapping[str, Any]) -> str:
    """The device a claim would be allocated: its parent interface, else the first plugin."""
    plugins = config.get("plugins") or [config]
    for plugin in plugins:
        parent = plugin.get(PARENT_FIELDS.get(str(plugin.get("type")), ""))
        if isinstance(parent, str) and parent:
            return _dns_label(parent)
    return _dns_label(f"cni-{plugins[0].get('type', 'network')}")


def parents(attachments: Sequence[Attachment]) -> list[str]:
    names: list[str] = []
    for att in attachments:
        for plugin in att.network.get("plugins", []):
            parent = plugin.get(PARENT_FIELDS.get(str(plugin.get("type")), ""))
            if isinstance(parent, str) and parent and parent not in names:
                names.append(parent)
    return names


def relocated(attachment: Attachment, layout: StateLayout) -> Attachment:
    """The same attachment with its plugins' state under another state root."""
    network = owned_network(attachment.network, attachment.netconf.name, layout.private_dirs())
    return replace(attachment, network=network)


@contextlib.contextmanager
def safe_node(attachments: Sequence[Attachment], keep: bool) -> Iterator[tuple[Path, Path]]:
    """A node namespace with a stand-in veth for every host interface the configs name.
    Removed on exit unless `keep` and the body finished."""
    scratch = Path(tempfile.mkdtemp(prefix="cnidra-try-"))
    node = netns.create("cnidra-try-node")
    try:
        for i, name in enumerate(parents(attachments)):
            _ip(
                "-n",
                node.name,
                "link",
                "add",
                name,
                "type",
                "veth",
                "peer",
                "name",
                f"cnidra-sp{i}",
            )
            _ip("-n", node.name, "link", "set", name, "up")
            _ip("-n", node.name, "link", "set", f"cnidra-sp{i}", "up")
        yield node, scratch
    except BaseException:
        keep = False
        raise
    finally:
        if not keep:
            netns.remove(node)
            shutil.rmtree(scratch, ignore_errors=True)


async def run_attachments(
    runtime: CNIRuntime, attachments: Sequence[Attachment], pod: str, keep: bool
) -> TryResult:
    container_id = TRY_CONTAINER
    try:
        outcomes = await attach_all(runtime, attachments, container_id, pod)
        ok = True
        cleanup: list[str] = []
    except AttachFailed as failed:
        outcomes, ok, cleanup = failed.outcomes, False, failed.cleanup_errors
    statuses = [device_status(o) for o in outcomes]
    if ok and not keep:
        cleanup = await detach_all(runtime, attachments, container_id, pod)
    return TryResult(outcomes, ok, statuses, cleanup_errors=cleanup)


def execute(
    plan: TryPlan, cni_path: Sequence[str], state_dir: Path | None, timeout: float
) -> TryResult:
    if plan.host:
        layout = StateLayout(state_dir) if state_dir else HOST_LAYOUT
        attachments = [relocated(a, layout) for a in plan.attachments]
        runtime = CNIRuntime(cni_path, str(layout.cni_cache), timeout)
        with _pod_namespace(plan.pod_netns, plan.keep) as pod:
            result = asyncio.run(run_attachments(runtime, attachments, str(pod), plan.keep))
            if plan.keep and plan.pod_netns is None:
                result.kept.append(f"pod namespace {pod}")
            return result
    with safe_node(plan.attachments, plan.keep) as (node, scratch):
        layout = StateLayout(scratch)
        attachments = [relocated(a, layout) for a in plan.attachments]
        runtime = CNIRuntime(cni_path, str(layout.cni_cache), timeout)
        with netns.entered(node), _pod_namespace(plan.pod_netns, plan.keep) as pod:
            result = asyncio.run(run_attachments(runtime, attachments, str(pod), plan.keep))
            if plan.keep:
                result.kept += [f"node namespace {node}", f"scratch directory {scratch}"]
                if plan.pod_netns is None:
                    result.kept.append(f"pod namespace {pod}")
        return result


@contextlib.contextmanager
def _pod_namespace(given: str | None, keep: bool) -> Iterator[Path]:
    if given:
        yield Path(given)
        return
    pod = netns.create("cnidra-try-pod")
    try:
        yield pod
    finally:
        if not keep:
            netns.remove(pod)


def default_pool(host: bool) -> str:
    return _dns_label(socket.gethostname()) if host else SAFE_POOL


def _dns_label(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:63] or "device"


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
