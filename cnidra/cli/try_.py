"""`cnidra try`: do for one claim what the driver does for a pod, on this machine.

Safe by default: plugins run in a throwaway "node" network namespace with stand-in links for
the host interfaces the config names, host-local keeps its allocations in a scratch directory,
and the result cache lives there too. `--host` runs against the real host instead.

Offline: a network with cnidra IPAM (`ipam: {type: cnidra, pool: NAME}`) takes its addresses
from the CNIIPPool of that name among the input's documents, handed out by host-local over the
pool's ranges in try's own state (the driver leases them cluster-wide through the apiserver)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
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

from cnidra.api.hostside import NodeFacts
from cnidra.api.ipam import IPAM_TYPE, POOL_KIND, Pool, PoolError, cnidra_ipam, pool_from_object
from cnidra.api.issues import Issues
from cnidra.api.merge import Source
from cnidra.api.ownership import owned_network
from cnidra.api.refs import ObjectRef
from cnidra.api.validate import DocumentReport, ResolvedRequest, catalog_of
from cnidra.cni import netns
from cnidra.cni.attach import (
    AttachFailed,
    Attachment,
    Outcome,
    attach_all,
    changed,
    detach_all,
)
from cnidra.cni.runtime import CNIRuntime
from cnidra.dra.resolve import Device, resolve_attachment
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
    """Input try cannot run as the driver would (a usage error, exit 2): first of all a config
    that leaves its parent link to the allocation, tried on the real host."""


class PoolNotInInput(NoParent):
    """A network with cnidra IPAM whose CNIIPPool is not among the input's documents: try has
    no apiserver to read it from."""


class Refused(ValueError):
    """What prepare refuses (its verdict, through the path prepare takes): invalid input,
    exit 1. `problems`: each a field path and what is wrong there."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def plan_attachments(
    reports: Sequence[DocumentReport],
    pool: str,
    *,
    host: bool = False,
    documents: Sequence[Any] = (),
    notes: list[str] | None = None,
    policy_documents: Sequence[Any] = (),
    namespace_labels: Mapping[str, str] | None = None,
    node: NodeFacts | None = None,
) -> list[Attachment]:
    """What the driver would attach, made by prepare's own path (`resolve_attachment`), for a pod
    `cnidra-try` in namespace `cnidra-try`, state under the --host state root. A config that
    names no parent link (the claim selects its link by attribute and prepare fills the
    allocated one in) is bound to a stand-in link (allocated0, ...) in the throwaway node; on the
    real host there is no allocation to take it from (NoParent). A network with cnidra IPAM
    takes its addresses from its CNIIPPool among `documents` (the input the reports are of),
    handed out locally (`local_pool_ipam`; PoolNotInInput when the pool is not there); what
    the user should know about that is appended to `notes`.

    Every request takes prepare's path (`resolve_attachment`), judged in the claim's own
    namespace (its class's CNIPolicy for that namespace with `namespace_labels`, the pools that
    serve it) and named as a claim of try's: the merge, the binding to the link, the names and
    directories cnidra owns, and, given `node` (the machine's links: `cnidra try` reads them),
    the host-side judgement, which pins or refuses what would change a shared host object. A
    request whose DeviceClass is known (in `policy_documents`, try's --policy, or in the input)
    has its class's CNIPolicy judged too; one whose class is not given has everything but that
    judged (a warning in its report says so). What prepare's path refuses raises Refused."""
    out: list[Attachment] = []
    pod = ObjectRef(TRY_NAMESPACE, TRY_NAMESPACE, str(uuid.uuid4()))
    stand_ins = 0
    pools = input_pools(documents)
    used: dict[str, list[str]] = {}  # pool -> networks that take from it
    catalog = catalog_of([*policy_documents, *documents])
    for report in reports:
        doc = documents[report.index] if report.index < len(documents) else None
        name = report.name or f"{report.kind}-{report.index}"
        # judged in the claim's own namespace (its policy's namespaceSelector, the pools that
        # serve it); run as a claim of try's namespace (what try writes is named as try's)
        judged_as = ObjectRef(_namespace(doc), name, "")
        claim = ObjectRef(TRY_NAMESPACE, name, "")
        for resolved in report.resolved:
            config = resolved.config.config
            assert config is not None
            link: str | None = None
            missing = unnamed_parent(config)
            if missing:
                if host:
                    raise NoParent(
                        f"request {resolved.request!r} leaves {missing} to the link the "
                        "scheduler allocates; with --host, name the host link in the config"
                    )
                link = f"{ALLOCATED}{stand_ins}"
                stand_ins += 1
            else:  # the link prepare would be allocated: the one the config names
                link = named_parent(config)
            # the device's name: the stand-in's, or the named parent's as a DNS label
            device = Device(pool, link if missing and link else device_name(config), link=link)
            issues = Issues()
            attachment = resolve_attachment(
                resolved.judged,
                resolved.request,
                judged_as,
                device,
                HOST_LAYOUT.private_dirs(),
                issues,
                resolved.where,
                namespace_labels=namespace_labels or {},
                catalog=catalog,
                node=node,
                class_known=resolved.class_known,
                named_as=claim,
            )
            if attachment is None:
                raise Refused([f"{i.path}: {i.message}" for i in issues.errors])
            if resolved.config.if_name and not attachment.if_name:
                # named as prepare names the pod's interfaces after resolving (the validator
                # assigned the name with the same rules: cnidra.api.naming)
                attachment = changed(attachment, if_name=resolved.config.if_name)
            taken = pool_name(attachment.network)
            if taken is not None:
                where = f"request {resolved.request!r} (network {attachment.network_name})"
                attachment = local_pool_ipam(attachment, pools, taken, where)
                used.setdefault(taken, []).append(attachment.network_name)
                ranges = attachment.pool_ranges if resolved.class_known else None
                refused = serves(pools[taken], _namespace(doc), _tenant_network(resolved), ranges)
                if refused:
                    raise Refused([f"{resolved.where}: {where}: {refused}"])
            out.append(attachment.for_pod(pod, TRY_CONTAINER))
    if used and notes is not None:
        notes.append(pool_note(used, pools))
    return out


def pool_note(used: Mapping[str, Sequence[str]], pools: Mapping[str, Pool]) -> str:
    """One line for the networks that take addresses from CNIIPPools: where try's come from,
    and where they differ from the driver's."""
    taken = "; ".join(f"CNIIPPool {p} for network {', '.join(n)}" for p, n in used.items())
    caveats = []
    if any(len(n) > 1 for n in used.values()):
        caveats.append("networks sharing a pool each keep their own store, so may get one address")
    if any(pools[p].spec.reservations for p in used):
        caveats.append(
            "the pool's reservations are left out, as for any pod but the ones they name"
        )
    if any(r.gateway is None for p in used for r in pools[p].spec.ranges):
        caveats.append(
            "host-local takes a range's first address as its gateway where the pool names none"
        )
    return (
        f"addresses from {taken}: the driver leases them cluster-wide through the apiserver "
        "(no address twice in the cluster); try hands them out only locally, by host-local "
        "over the pool's ranges in try's own state"
        + (f" ({'; '.join(caveats)})" if caveats else "")
    )


def input_pools(documents: Sequence[Any]) -> dict[str, Pool]:
    """The valid CNIIPPools among the input's documents, by name (an invalid one has made the
    input invalid before try plans anything)."""
    pools: dict[str, Pool] = {}
    for doc in documents:
        if isinstance(doc, dict) and doc.get("kind") == POOL_KIND:
            try:
                pool = pool_from_object(doc)
            except PoolError:
                continue
            pools[pool.name] = pool
    return pools


def pool_name(network: Mapping[str, Any]) -> str | None:
    """The CNIIPPool a network's cnidra IPAM names ("" for one it does not name)."""
    uses = cnidra_ipam(network)
    return str(uses[0][1].get("pool") or "") if uses else None


def local_pool_ipam(
    attachment: Attachment, pools: Mapping[str, Pool], name: str, where: str
) -> Attachment:
    """The attachment with its cnidra IPAM rewritten to host-local over the pool's ranges (its
    gateway and routes, and the network's own routes), host-local's state under try's state
    root, as `owned_network` places it. The driver hands the plugin `static` IPAM with
    addresses leased cluster-wide; offline, try has only this machine to keep them in."""
    pool = pools.get(name)
    if pool is None:
        raise PoolNotInInput(
            f"cannot run {where}: it takes its addresses from CNIIPPool {name or '(unnamed)'}, "
            "which is not in the input. `ipam: {type: cnidra}` is no plugin: the driver "
            "leases the pool's addresses through the cluster, and cnidra try does not read the "
            f"cluster, so add the CNIIPPool {name} (the admin's, as applied) to the file and "
            "try hands its addresses out locally"
        )
    plugins = []
    for plugin in attachment.network.get("plugins") or []:
        ipam = plugin.get("ipam") if isinstance(plugin, Mapping) else None
        if isinstance(ipam, Mapping) and ipam.get("type") == IPAM_TYPE:
            plugins.append({**plugin, "ipam": host_local_ipam(pool, ipam, where)})
        else:
            plugins.append(plugin)
    network = {**attachment.network, "plugins": plugins}
    dirs = HOST_LAYOUT.private_dirs()  # as plan_attachments made it; `relocated` moves it
    return replace(attachment, network=owned_network(network, str(network["name"]), dirs))


def host_local_ipam(pool: Pool, ipam: Mapping[str, Any], where: str) -> dict[str, Any]:
    """host-local's IPAM config handing out what the pool hands out: one range set per
    address family (a pod gets one address of each, as from the pool), each the pool's range
    (rangeStart to rangeEnd) with its exclusions and its reservations cut out (try's pod is
    none of the pods they are reserved for), the gateway (which host-local skips), the pool's
    routes and then the network's own."""
    range_sets = []
    reserved = [ipaddress.ip_network(r.address) for r in pool.spec.reservations]
    for r in pool.spec.ranges:
        excluded = [n for n in [*pool.spec.exclude, *reserved] if n.version == r.subnet.version]
        runs = _runs(int(r.first), int(r.last), excluded)
        if not runs:
            raise NoParent(
                f"{where}: CNIIPPool {pool.name} hands out no address of {r.subnet} (its "
                "exclude covers the whole range), so the driver cannot give it one either"
            )
        make = ipaddress.IPv6Address if r.subnet.version == 6 else ipaddress.IPv4Address
        gateway = {"gateway": str(r.gateway)} if r.gateway is not None else {}
        range_sets.append(
            [
                {
                    "subnet": str(r.subnet),
                    "rangeStart": str(make(low)),
                    "rangeEnd": str(make(high)),
                    **gateway,
                }
                for low, high in runs
            ]
        )
    out: dict[str, Any] = {"type": "host-local", "ranges": range_sets}
    routes: list[Mapping[str, Any]] = [
        {"dst": str(r.dst), **({"gw": str(r.gw)} if r.gw is not None else {})}
        for r in pool.spec.routes
    ]
    routes += [r for r in ipam.get("routes") or [] if isinstance(r, Mapping)]
    if routes:
        out["routes"] = routes
    return out


def _runs(
    low: int, high: int, excluded: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network]
) -> list[tuple[int, int]]:
    """[low, high] without the excluded networks, as sorted inclusive runs."""
    runs = [(low, high)]
    for net in excluded:
        start, end = int(net.network_address), int(net.broadcast_address)
        cut = []
        for a, b in runs:
            if end < a or start > b:
                cut.append((a, b))
                continue
            if a < start:
                cut.append((a, start - 1))
            if end < b:
                cut.append((end + 1, b))
        runs = cut
    return sorted(runs)


def _namespace(doc: Any) -> str:
    """The namespace `kubectl apply` would put a document in (default when it names none)."""
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    namespace = meta.get("namespace") if isinstance(meta, dict) else None
    return namespace if isinstance(namespace, str) and namespace else "default"


def _tenant_network(resolved: ResolvedRequest) -> bool:
    """The network is the claim's own (it writes `config`), not an admin's."""
    return resolved.network is None and any(
        e.source is Source.CLAIM and "config" in e.parameters for e in resolved.entries
    )


def serves(
    pool: Pool, namespace: str, tenant: bool, allowed: Sequence[Any] | None = None
) -> str | None:
    """Why prepare would not give a claim of `namespace` addresses from the pool (`allowed`:
    the class's claims.ipRanges, when the class is known)."""
    if tenant:
        return pool.tenant_problem(namespace, list(allowed) if allowed is not None else None)
    if not pool.allows_namespace(namespace):
        return f"CNIIPPool {pool.name} does not serve namespace {namespace} (spec.namespaces)"
    return None


def unnamed_parent(config: Mapping[str, Any]) -> str | None:
    """The parent field (e.g. `macvlan.master`) of a plugin that takes one and names none (a
    bridge plugin names its bridge, which it makes when missing)."""
    plugins = config.get("plugins") or [config]
    for plugin in plugins:
        field = {**PARENT_FIELDS, "bridge": "bridge"}.get(str(plugin.get("type")))
        if field and not plugin.get(field):
            return f"{plugin.get('type')}.{field}"
    return None


def named_parent(config: Mapping[str, Any]) -> str | None:
    """The link a config names as its plugins' parent (`macvlan.master`, the bridge a bridge
    plugin makes or joins): the device a claim with it would be allocated, whose facts the
    host-side judgement reads."""
    plugins = config.get("plugins") or [config]
    for plugin in plugins:
        field = {**PARENT_FIELDS, "bridge": "bridge"}.get(str(plugin.get("type")))
        named = plugin.get(field) if field else None
        if isinstance(named, str) and named:
            return named
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
