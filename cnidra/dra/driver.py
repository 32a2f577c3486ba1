"""`cnidra driver`: the node agent. Wires the kubelet plugin, the claim cache, the ResourceSlice
publisher and the HTTP endpoint together, and stops them in an order kubelet understands."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health as grpc_health
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cnidra._proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from cnidra.api.constants import DRIVER_NAME
from cnidra.cni.runtime import CNIRuntime
from cnidra.dra.health import serve_http
from cnidra.dra.plugin import DRAService, RegistrationService
from cnidra.dra.prepare import DEFAULT_MAX_ATTACHMENTS, Preparer
from cnidra.inventory.links import LinkFilter
from cnidra.inventory.publisher import SlicePublisher
from cnidra.inventory.slices import SliceSettings
from cnidra.kube.claims import ClaimCache
from cnidra.kube.client import make_client
from cnidra.nri.lifecycle import HookBudget, PodNetworks
from cnidra.nri.plugin import NRIPlugin
from cnidra.state.checkpoint import Checkpoint
from cnidra.state.layout import DEFAULT_STATE_ROOT, LEGACY_CNI_DIR, StateLayout
from cnidra.state.migrate import migrate_legacy
from cnidra.state.sandboxes import SandboxStore
from cnidra.status.writer import StatusWriter

log = logging.getLogger(__name__)


@dataclass
class DriverSettings:
    node_name: str
    kubeconfig: str | None = None
    plugins_registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    plugins_dir: Path = Path("/var/lib/kubelet/plugins")
    state_dir: Path = DEFAULT_STATE_ROOT
    legacy_cni_dir: Path = LEGACY_CNI_DIR
    cni_path: list[str] = field(default_factory=lambda: ["/opt/cni/bin"])
    http_address: str = "127.0.0.1:9177"
    sub_interfaces: int = 64
    include_interfaces: str = ".*"
    exclude_interfaces: str = LinkFilter.exclude
    resync_seconds: float = 60.0
    api_timeout: float = 10.0
    nri_socket: str = "/var/run/nri/nri.sock"
    nri_plugin_name: str = "cnidra"
    nri_plugin_index: str = "50"
    cni_timeout: float = 10.0
    concurrent_attach: bool = False
    attach_budget: float = 0.0
    max_attachments: int = DEFAULT_MAX_ATTACHMENTS

    @property
    def registration_socket(self) -> Path:
        return self.plugins_registry_dir / f"{DRIVER_NAME}-reg.sock"

    @property
    def dra_socket(self) -> Path:
        return self.plugins_dir / DRIVER_NAME / "dra.sock"


class Driver:
    def __init__(self, settings: DriverSettings) -> None:
        self.settings = settings
        self.client = make_client(settings.kubeconfig, settings.api_timeout)
        self.layout = StateLayout(settings.state_dir)
        self.checkpoint = Checkpoint(self.layout)
        self.claims = ClaimCache(self.client, settings.node_name)
        self.preparer = Preparer(
            settings.node_name,
            self.claims,
            self.checkpoint,
            self.layout.private_dirs(),
            settings.max_attachments,
        )
        self.runtime = CNIRuntime(
            settings.cni_path, str(self.layout.cni_cache), settings.cni_timeout
        )
        self.status = StatusWriter(self.client)
        self.sandboxes = SandboxStore(self.layout)
        # before anything can DEL: records of cnidra 0.1 name networks in the shared directory
        migrate_legacy(self.layout, settings.legacy_cni_dir, self.sandboxes)
        self.pods = PodNetworks(
            self.checkpoint,
            self.runtime,
            self.sandboxes,
            self.status,
            concurrent=settings.concurrent_attach,
            budget=HookBudget(settings.attach_budget),
            max_attachments=settings.max_attachments,
        )
        self.nri = NRIPlugin(
            self.pods, settings.nri_socket, settings.nri_plugin_name, settings.nri_plugin_index
        )
        self.dra = DRAService(self.preparer, after_unprepare=self.pods.unprepare_claim)
        self.registration = RegistrationService(str(settings.dra_socket))
        self.publisher = SlicePublisher(
            self.client,
            SliceSettings(settings.node_name, settings.sub_interfaces),
            settings.cni_path,
            LinkFilter(settings.include_interfaces, settings.exclude_interfaces),
            resync=settings.resync_seconds,
        )
        self.health = grpc_health.aio.HealthServicer()  # type: ignore[attr-defined]
        self._servers: list[grpc.aio.Server] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self.started = time.time()

    def healthz(self) -> tuple[bool, dict[str, Any]]:
        details = {
            "node": self.settings.node_name,
            "registeredWithKubelet": self.registration.registered.is_set(),
            "registrationError": self.registration.error,
            "claimCacheSynced": self.claims.synced.is_set(),
            "preparedClaims": len(self.checkpoint),
            "lastSlicePublish": self.publisher.last_publish,
            "poolGeneration": self.publisher.generation,
            "nriConnected": self.nri.connected.is_set(),
            "nriSessions": self.nri.sessions,
            "nriRuntime": self.nri.runtime,
            "nriError": self.nri.last_error,
            "sandboxes": len(self.sandboxes),
            "statusPending": self.status.pending(),
        }
        # Serving kubelet is what liveness is about; a disconnected runtime (containerd
        # restarting) is reported as degraded, so a probe does not restart the driver for it.
        details["degraded"] = not self.nri.connected.is_set()
        return bool(self._servers) and self.registration.error is None, details

    async def start(self) -> None:
        s = self.settings
        for sock in (s.registration_socket, s.dra_socket):
            sock.parent.mkdir(parents=True, exist_ok=True)
            sock.unlink(missing_ok=True)
        dra_server = grpc.aio.server()
        dra_server.add_generic_rpc_handlers(tuple(self.dra.handlers()))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, dra_server)
        dra_server.add_insecure_port(f"unix://{s.dra_socket}")
        await dra_server.start()
        reg_server = grpc.aio.server()
        reg_grpc.add_RegistrationServicer_to_server(self.registration, reg_server)
        reg_server.add_insecure_port(f"unix://{s.registration_socket}")
        await reg_server.start()  # kubelet's watcher notices this socket and registers us
        self._servers = [dra_server, reg_server]
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        http = await serve_http(s.http_address, self.healthz)
        self.pods.restore_status()
        self._tasks = [
            asyncio.create_task(self.status.run(), name="status-writer"),
            asyncio.create_task(self.nri.run(), name="nri"),
            asyncio.create_task(self.pods.run_sweeper(), name="sandbox-sweeper"),
            asyncio.create_task(self.claims.run(), name="claim-cache"),
            asyncio.create_task(self.publisher.run(), name="slice-publisher"),
            asyncio.create_task(http.serve_forever(), name="http"),
        ]
        log.info(
            "driver %s up on node %s: registration %s, DRA %s, http %s",
            DRIVER_NAME,
            s.node_name,
            s.registration_socket,
            s.dra_socket,
            s.http_address,
        )

    async def stop(self) -> None:
        """Registration socket first (kubelet stops sending), then DRA, then the rest."""
        await self.health.enter_graceful_shutdown()
        for server in reversed(self._servers):
            await server.stop(grace=2)
        self._servers = []
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for sock in (self.settings.registration_socket, self.settings.dra_socket):
            sock.unlink(missing_ok=True)
        with contextlib.suppress(Exception):
            await self.client.close()


async def run(settings: DriverSettings) -> None:
    driver = Driver(settings)
    await driver.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    loop.add_signal_handler(signal.SIGHUP, driver.nri.reconnect)
    await stopping.wait()
    log.info("stopping (pid %d)", os.getpid())
    await driver.stop()
