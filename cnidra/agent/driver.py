"""`cnidra driver`: the node agent. The composition root: it builds every part from the
settings, wires them together, supervises the background work, and stops in an order kubelet
understands. No other module knows how the parts fit."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from grpclib.health.check import ServiceStatus
from grpclib.health.service import OVERALL, Health

from cnidra.agent.settings import DriverSettings
from cnidra.api.constants import DRIVER_NAME
from cnidra.cni.runtime import CNIRuntime
from cnidra.datapath import netpolicy as netpolicy_datapath
from cnidra.datapath import shaping
from cnidra.dra.ahead import ClaimsAhead, ReadAhead
from cnidra.dra.plugin import DRAService, RegistrationService
from cnidra.dra.prepare import Preparer
from cnidra.inventory.links import LinkFilter
from cnidra.inventory.publisher import SlicePublisher
from cnidra.inventory.slices import SliceSettings
from cnidra.ipam.accounting import BlockLeaseWriter, PoolAccountant, account_while_leading
from cnidra.ipam.allocator import Allocator
from cnidra.ipam.reconcile import IPAMReconciler
from cnidra.kube.api import Api
from cnidra.kube.claims import ClaimGetter, NamespaceGetter
from cnidra.kube.client import ClusterFeatures, dra_api_problem, make_client, probe_features
from cnidra.kube.deviceclasses import Feeds, follow_device_classes
from cnidra.kube.ipam import KubeIPAM
from cnidra.kube.netpolicy import follow_all
from cnidra.kube.networks import NetworkReader, ServedNetworks
from cnidra.kube.pods import NodePods
from cnidra.nodeapi.service import NodeNetworksService
from cnidra.nodeapi.service import serve as serve_node_api
from cnidra.nodeapi.views import NodeRecords
from cnidra.nri.bandwidth import BandwidthKeeper
from cnidra.nri.budget import HookBudget
from cnidra.nri.hooks import PodHooks
from cnidra.nri.hotplug import PlugError
from cnidra.nri.lifecycle import PodLifecycle
from cnidra.nri.netpolicy import PolicyEnforcer, read_drops
from cnidra.nri.plugin import NRIPlugin
from cnidra.nri.reconcile import Reconciler
from cnidra.observe import metrics
from cnidra.observe.http import HTTPEndpoint
from cnidra.observe.tasks import Supervisor
from cnidra.state import gate as gate_script
from cnidra.state.checkpoint import Checkpoint, PreparedClaim
from cnidra.state.ipam import IPAMState
from cnidra.state.journal import Journal
from cnidra.state.layout import StateLayout
from cnidra.state.migrate import migrate_legacy
from cnidra.state.sandboxes import SandboxStore
from cnidra.status.metadata import DeviceMetadata
from cnidra.status.netpolicy import PolicyStatusWriter
from cnidra.status.writer import StatusWriter
from cnidra.util.aio import reap_children_by_pidfd
from cnidra.util.locks import KeyedLocks
from cnidra.util.memory import cap_malloc_arenas, settle_gc, small_tls_reads
from cnidra.util.rpc import RPCServer
from cnidra.util.workers import start_workers

log = logging.getLogger(__name__)
STATUS_FLUSH_SECONDS = 5.0


REASON_PREPARED = "Prepared"


def read_limits(
    netns: str, interfaces: Sequence[str], timeout: float
) -> Mapping[str, shaping.Shaping]:
    """The rate limits of a pod's interfaces, for the metrics and node describe (the caller
    is off the event loop: the scrape's thread, or asyncio.to_thread)."""
    return shaping.read_many(netns, interfaces, timeout=timeout)


def read_policy_counters(netns: str, table: str, timeout: float) -> list[Any]:
    """A pod's policy table's counted rules (the caller is off the event loop)."""
    return netpolicy_datapath.counters(netns, table, timeout=timeout)


def prepared_message(claim: PreparedClaim, node: str) -> str:
    """What `kubectl describe resourceclaim` shows once the node has checked and recorded it."""
    parts = [
        f"request {d.request} as {d.if_name} on {d.device}"
        + (f" ({d.status_name or d.network_label})" if d.status_name or d.network_label else "")
        for d in claim.devices
    ]
    return f"Prepared on node {node}: " + "; ".join(parts)


class Driver:
    def __init__(self, settings: DriverSettings) -> None:
        self.settings = settings
        self.client = make_client(settings.kubeconfig, settings.api_timeout)
        self.features = ClusterFeatures(known=False)
        self.layout = StateLayout(settings.state_dir)
        self.checkpoint = Checkpoint(self.layout)
        self.status = StatusWriter(
            self.client,
            releases=self.layout.finalizer_releases,
            normal_events=settings.normal_events,
            node=settings.node_name,
        )
        # the IPAM's and the pool accountant's Events go through the status writer's queue
        kube_ipam = KubeIPAM(
            self.client, settings.api_timeout, settings.node_name, self.status.object_event
        )
        self.ipam = Allocator(
            settings.node_name,
            IPAMState(self.layout),
            kube_ipam,
            node_addresses=self._node_addresses,
        )
        # pool accounting (docs/ipam.md): this node's leased counts into its blocks' status,
        # and, in the one driver holding the Lease, the pools' counts and the Pending pods
        self.block_leases = BlockLeaseWriter(self.ipam.state, kube_ipam)
        self.pool_accountant = PoolAccountant(
            kube_ipam, DRIVER_NAME, interval=settings.pool_status_seconds
        )
        self._kube_ipam = kube_ipam
        self.publisher = SlicePublisher(
            self.client,
            SliceSettings(
                settings.node_name,
                settings.sub_interfaces,
                taint_effect=settings.link_failure_taint,
            ),
            settings.cni_path,
            LinkFilter(settings.include_interfaces, settings.exclude_interfaces),
            resync=settings.resync_seconds,
            publish_node_links=settings.publish_node_links,
            networks=ServedNetworks(self.client, settings.cni_conf_dir),
            pool_capacity=self.ipam.capacity,
            in_use=lambda: {d.parent for c in self.checkpoint.all() for d in c.devices if d.parent},
        )
        self.ipam.blocks_changed = self.publisher.poke
        gate = None
        if settings.container_gate:
            on_node = StateLayout(Path(settings.host_state_dir or settings.state_dir))
            gate_script.install(self.layout.gate)
            gate = gate_script.hook_args(on_node.gate, on_node.sandboxes)
        self.metadata = (
            DeviceMetadata(
                settings.plugin_data_dir,
                settings.cdi_dir,
                mounts=settings.device_metadata,
                gate=gate,
            )
            if settings.device_metadata or gate
            else None
        )
        self.preparer = Preparer(
            settings.node_name,
            ClaimGetter(self.client, settings.api_timeout),
            self.checkpoint,
            self.layout.private_dirs(),
            settings.max_attachments,
            view=self.publisher.view,
            namespaces=NamespaceGetter(self.client, settings.api_timeout),
            metadata=self.metadata,
            networks=NetworkReader(self.client, settings.cni_conf_dir, settings.api_timeout),
            ipam=self.ipam,
        )
        # claims read when their pods are bound, so prepare needs no GET (cnidra.dra.ahead)
        self.read_ahead: ReadAhead | None = None
        if settings.read_claims_ahead:
            self.preparer.ahead = ClaimsAhead()
            self.read_ahead = ReadAhead(
                NodePods(self.client, settings.node_name).watch,
                self.preparer.claims,
                self.preparer.ahead,
                self.preparer.warm,
            )
        # live: prepared, or being prepared (an address is leased before the claim is
        # checkpointed, and a prepare may wait on the apiserver for longer than the grace)
        metrics.POOLS.source = self.ipam.usage
        metrics.POOL_ACCOUNTS.source = lambda: self.pool_accountant.latest
        self.ipam_reconciler = IPAMReconciler(
            self.ipam,
            lambda: {claim.uid for claim in self.checkpoint.all()} | self.preparer.in_flight(),
            persistent_users=self._persistent_users,
            grace=settings.ipam_grace_seconds,
        )
        self.runtime = CNIRuntime(
            settings.cni_path,
            str(self.layout.cni_cache),
            settings.cni_timeout,
            on_exec=metrics.observe_cni_exec,
        )
        self.preparer.on_prepared = self._prepared
        self.sandboxes = SandboxStore(self.layout)
        self.journal = Journal(self.layout.journal)
        # before anything can DEL: records of cnidra 0.1 name networks in the shared directory
        migrate_legacy(self.layout, settings.legacy_cni_dir, self.sandboxes)
        self.policy_status, self.policy = self._network_policy()
        metrics.POLICY_DROPS.source = lambda: read_drops(self.policy)
        self.bandwidth = self._rate_limits()
        self.lifecycle = PodLifecycle(
            self.checkpoint,
            self.runtime,
            self.sandboxes,
            self.status,
            concurrent=settings.concurrent_attach,
            budget=HookBudget(settings.attach_budget, behind=settings.cni_timeout),
            max_attachments=settings.max_attachments,
            protected_links=lambda: self.publisher.view().protected,
            metadata=self.metadata,
            journal=self.journal,
            network_status=settings.network_status,
            hold_from_attach=settings.claim_finalizer == "on-attach",
            policy=self.policy if settings.network_policy else None,
            bandwidth=self.bandwidth,
            locks=self.bandwidth.locks,  # the sandboxes' locks: the hooks' and the keeper's
        )
        metrics.INTERFACES.source = self.lifecycle.interfaces
        metrics.RATE_LIMITS.source = self.lifecycle.shaped_interfaces
        self.reconciler = Reconciler(self.lifecycle, self.layout.write_problem)
        # fail closed: no claim is prepared (so no pod of it started) while the runtime cannot
        # tell cnidra about the pod's sandbox
        self.preparer.unready = self._unready
        self.nri = NRIPlugin(
            PodHooks(self.lifecycle, self.reconciler, background=settings.attach_behind_sandbox),
            settings.nri_socket,
            settings.nri_plugin_name,
            settings.nri_plugin_index,
        )
        self.dra = DRAService(
            self.preparer,
            before_unprepare=self.reconciler.unprepare_claim,
            health=self.publisher.health,
        )
        self.registration = RegistrationService(str(settings.dra_socket))
        self.registration.on_registered = self.publisher.check_slices
        self.node_api = NodeNetworksService(
            self.node_records,
            self.journal,
            self.lifecycle,  # hot-plug through the lifecycle's faces (plug, unplug)
            refusals=(PlugError,),
            limits=read_limits,
            policy=self._describe_policy if settings.network_policy else None,
            policy_counters=read_policy_counters,
        )
        self.tasks = Supervisor()
        # grpc's health service on the DRA socket: the whole server's status only
        self.health = ServiceStatus()
        self.http = HTTPEndpoint(settings.http_address, self.healthz)
        self._servers: list[RPCServer] = []
        self.started = time.time()

    def _node_addresses(self) -> frozenset[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        """What the node holds on its links, as the publisher last read them."""
        return self.publisher.view().facts.addresses()

    def _describe_policy(self, namespace: str, name: str) -> Mapping[str, Any]:
        return self.policy.describe((namespace, name))

    def node_records(self) -> NodeRecords:
        return NodeRecords(
            tuple(self.checkpoint.all()), tuple(self.sandboxes.all()), tuple(self.journal.entries)
        )

    def healthz(self) -> tuple[bool, dict[str, Any]]:
        """Liveness is about serving kubelet and keeping the background work alive; a
        disconnected runtime (containerd restarting) is reported as degraded, so a probe does
        not restart the driver for it. Called from the HTTP thread: reads only."""
        details = {
            "node": self.settings.node_name,
            "registeredWithKubelet": self.registration.registered.is_set(),
            "registrationError": self.registration.error,
            "preparedClaims": len(self.checkpoint),
            "lastSlicePublish": self.publisher.last_publish,
            "poolGeneration": self.publisher.generation,
            "nriConnected": self.nri.connected.is_set(),
            "nriSessions": self.nri.sessions,
            "nriRuntime": self.nri.runtime,
            "nriError": self.nri.last_error,
            "sandboxes": len(self.sandboxes),
            "detachRetries": len(self.lifecycle.detaches),
            "statusPending": self.status.pending(),
            "tasks": self.tasks.report(),
            "stateProblem": self.reconciler.state_problem,
            "synchronized": self.reconciler.synchronized,
            "ipamPasses": self.ipam_reconciler.passes,
            "networkPolicySynced": self.policy.synced if self.settings.network_policy else None,
            "asyncioTasks": self._task_count(),
            "clusterFeatures": {
                "consumableCapacity": self.features.consumable_capacity,
                "deviceTaints": self.features.device_taints,
                "known": self.features.known,
            },
            # serving kubelet still, but not setting up pods: no restart fixes either
            "degraded": (
                not self.nri.connected.is_set() or self.reconciler.state_problem is not None
            ),
        }
        ok = bool(self._servers) and self.registration.error is None and self.tasks.healthy()
        return ok, details

    async def adapt_to_cluster(self) -> None:
        """Leave out of the slices what this cluster's apiserver would drop or refuse, and say
        so in the log and an Event on the Node."""
        self.features = await probe_features(self.client, self.settings.node_name, DRIVER_NAME)
        if not self.features.known:
            log.warning("the apiserver could not be asked which DRA fields it keeps; assuming all")
            return
        settings = self.publisher.settings
        self.publisher.settings = replace(
            settings,
            shared_capacity=settings.shared_capacity and self.features.consumable_capacity,
            taint_effect=settings.taint_effect if self.features.device_taints else "None",
        )
        left_out = self.features.left_out()
        for item in left_out:
            log.warning("this cluster lacks %s", item)
        if left_out:
            self.status.node_event(
                self.settings.node_name,
                "CnidraFeaturesLeftOut",
                "cnidra on this node leaves out " + "; ".join(left_out),
                "Warning",
            )

    def _task_count(self) -> int | None:
        """The driver loop's asyncio tasks (a soak watches that they do not grow)."""
        loop = getattr(self, "loop", None)
        if loop is None:
            return None
        for _ in range(3):  # the set may change while another thread copies it
            try:
                return len(asyncio.all_tasks(loop))
            except RuntimeError:
                continue
        return None

    def _unready(self) -> str | None:
        if self.reconciler.state_problem is not None:
            return self.reconciler.state_problem + " (prepare and attach need it); kubelet retries"
        if self.nri.connected.is_set():
            return None
        return (
            "cnidra's NRI connection to the container runtime is down (the runtime restarting, "
            "or the driver just started); kubelet retries"
        )

    def _persistent_users(self) -> dict[tuple[str, str], set[str]]:
        """(namespace, IPAMClaim) -> the claims prepared here that reference it."""
        users: dict[tuple[str, str], set[str]] = {}
        for claim in self.checkpoint.all():
            for device in claim.devices:
                if device.ipam_claim:
                    key = (claim.ref.namespace, device.ipam_claim)
                    users.setdefault(key, set()).add(f"{claim.ref.namespace}/{claim.ref.name}")
        return users

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        reap_children_by_pidfd()  # no thread a plugin exec'd (cnidra.util.aio)
        s = self.settings
        await self.adapt_to_cluster()
        await self.publisher.refresh_view()  # prepare and the hook read it from the first call
        restored = await asyncio.to_thread(self.preparer.restore_cdi)
        if restored:
            log.info("CDI specs of %d prepared claim(s) written again", restored)
        for sock in (s.registration_socket, s.dra_socket):
            sock.parent.mkdir(parents=True, exist_ok=True)
            sock.unlink(missing_ok=True)
        dra_server = RPCServer(self.dra.methods(), extra=[Health({OVERALL: [self.health]})])
        await dra_server.start(s.dra_socket)
        reg_server = RPCServer(self.registration.methods())
        await reg_server.start(s.registration_socket)  # kubelet's watcher registers us
        for sock in (s.registration_socket, s.dra_socket):
            os.chmod(sock, 0o600)
        node_server = await serve_node_api(self.node_api, self.layout.node_socket)
        self._servers = [node_server, dra_server, reg_server]
        self.health.set(True)
        self.http.start()
        self.lifecycle.restore_status()
        held = {claim for record in self.sandboxes.all() for claim in record.claims()}
        if released := self.status.restore_releases(held):
            log.info("releasing the finalizer of %d claim(s) a previous run left held", released)
        self.tasks.spawn("status-writer", self.status.run)
        self.tasks.spawn("nri", self.nri.run)
        self.tasks.spawn("sandbox-sweeper", lambda: self.reconciler.run_sweeper(s.sweep_seconds))
        self.tasks.spawn("slice-publisher", self.publisher.run)
        self.tasks.spawn("ipam-reconciler", self._reconcile_ipam)
        self.tasks.spawn("block-leases", lambda: self.block_leases.run(s.pool_status_seconds))
        if s.pool_accountant:
            self.tasks.spawn("pool-accountant", self._account_pools)
        self.tasks.spawn("rate-limits", self.bandwidth.run)
        classes = Api(self.client, s.api_timeout)
        # not critical: without it, the allocations' copies of the rules hold (and network
        # policy, not synced, keeps its default deny)
        feeds = Feeds(self.bandwidth, self.policy) if s.network_policy else self.bandwidth
        self.tasks.spawn(
            "deviceclass-watch", lambda: follow_device_classes(classes, feeds), critical=False
        )
        self._watch_pods()
        log.info(
            "driver %s up on node %s: registration %s, DRA %s, http %s",
            DRIVER_NAME,
            s.node_name,
            s.registration_socket,
            s.dra_socket,
            s.http_address,
        )

    def _watch_pods(self) -> None:
        """The claims' read-ahead (the node-scoped watch of its pods) and network policy (every
        pod, while a policy exists: cnidra.kube.netpolicy.PolicyGate); neither critical to the
        driver (without the read-ahead prepare GETs each claim)."""
        s = self.settings
        if self.read_ahead is not None:
            self.tasks.spawn("claims-ahead", self.read_ahead.run, critical=False)
        if s.network_policy:
            self.policy.restore()  # the tables of the pods attached before a restart
            self.tasks.spawn("netpolicy", self.policy.run)
            api = Api(self.client, s.api_timeout)
            self.tasks.spawn("netpolicy-watches", lambda: follow_all(api, self.policy))

    def _network_policy(self) -> tuple[PolicyStatusWriter, PolicyEnforcer]:
        """The enforcer, and the writer of a policy's problems on this node (an Event and the
        policy's status entry of this node); the claims' conditions go to the status writer."""
        settings = self.settings
        reports = PolicyStatusWriter(
            Api(self.client, settings.api_timeout),
            settings.node_name,
            self.status.object_event,
            lane=self.status.lane("policy"),
            wake=self.status.wake,
        )
        self.status.join(reports)  # written by the status writer's worker, on its one queue
        enforcer = PolicyEnforcer(
            self.sandboxes,
            events=self.status,
            conditions=self.status,
            reports=reports,
            node_name=settings.node_name,
            bridge_on_host=settings.bridge_policy_on_host,
            enabled=settings.network_policy,
        )
        return reports, enforcer

    def _prepared(self, claim: PreparedClaim) -> None:
        self.status.claim_event(
            claim.ref, REASON_PREPARED, prepared_message(claim, self.settings.node_name)
        )
        self.bandwidth.changed()  # a grant counts from prepare on (cnidra.nri.bandwidth)

    def _rate_limits(self) -> BandwidthKeeper:
        """Rate limits kept to the class's rules and, for Leftover, to the link's reservations
        while pods run (cnidra.nri.bandwidth), under the hook's sandbox locks; their metrics."""
        keeper = BandwidthKeeper(
            self.sandboxes, self.status, KeyedLocks(), checkpoint=self.checkpoint
        )
        self.preparer.on_unprepared = lambda _ref: keeper.changed()
        metrics.RATE_LIMITS.read = read_limits
        return keeper

    async def _reconcile_ipam(self) -> None:
        await self.ipam_reconciler.run(
            self.settings.ipam_reconcile_seconds, self.settings.ipam_lost_node_passes
        )

    async def _account_pools(self) -> None:
        s = self.settings
        await account_while_leading(
            self.pool_accountant,
            self._kube_ipam,
            s.pool_accountant_namespace,
            s.node_name,
            s.pool_accountant_lease_seconds,
        )

    async def stop(self) -> None:
        """Registration socket first (kubelet stops sending), then DRA, then the rest."""
        self.health.set(False)
        for server in reversed(self._servers):
            await server.stop(grace=2)
        self._servers = []
        # status and finalizer removals queued by the last hooks (what is left is kept on disk)
        try:
            async with asyncio.timeout(STATUS_FLUSH_SECONDS):
                await self.status.flushed()
        except TimeoutError:
            log.warning("%d status write(s) not flushed before stopping", self.status.pending())
        await self.tasks.stop()
        self.http.stop()
        for sock in (
            self.settings.registration_socket,
            self.settings.dra_socket,
            self.layout.node_socket,
        ):
            sock.unlink(missing_ok=True)
        # the durable stores settle: their files written whole and their logs emptied (what
        # an older driver, which reads the files alone, needs after a downgrade)
        for store in (self.checkpoint, self.ipam.state.blocks, self.ipam.state.leases):
            await store.quiet()
        await asyncio.to_thread(self._close_stores)
        try:
            await self.client.close()
        except Exception as exc:
            log.warning("closing the apiserver client: %s", exc)

    def _close_stores(self) -> None:
        self.checkpoint.close()
        self.ipam.state.close()


async def run(settings: DriverSettings) -> None:
    cap_malloc_arenas()
    small_tls_reads()
    start_workers(asyncio.get_running_loop())
    driver = Driver(settings)
    if problem := await dra_api_problem(driver.client):
        log.error("%s", problem)  # the pod's log says why it restarts, before anything else
        raise SystemExit(f"cnidra driver: {problem}")
    await driver.start()
    log.debug("%d objects of the driver's start-up frozen out of the collector", settle_gc())
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    loop.add_signal_handler(signal.SIGHUP, driver.nri.reconnect)
    await stopping.wait()
    log.info("stopping (pid %d)", os.getpid())
    await driver.stop()
