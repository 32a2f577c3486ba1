"""The kubelet-facing gRPC services: plugin registration and the DRA plugin (v1 and v1beta1).

v1 and v1beta1 of the DRA API have the same messages with the same field numbers, so one
implementation serves both service names, decoding either with the v1 message types (only the
v1 proto is kept: cnidra/_proto/README.md)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from cnidra._proto.dra.v1 import api_pb2 as dra
from cnidra._proto.drahealth.v1alpha1 import api_pb2 as health
from cnidra._proto.pluginregistration.v1 import api_pb2 as reg
from cnidra.api.constants import DRIVER_NAME
from cnidra.api.refs import ObjectRef
from cnidra.dra.prepare import PrepareError, Preparer
from cnidra.inventory.publisher import HealthBoard
from cnidra.observe import metrics
from cnidra.observe.logs import fields
from cnidra.state.checkpoint import PreparedClaim
from cnidra.util.rpc import Method, Methods, service_methods

log = logging.getLogger(__name__)

DRA_SERVICES = (
    "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
    "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
)
# kubelet's device-health service (KEP-4680): 1.36 calls v1alpha1 whenever the plugin serves it;
# 1.37 calls it only when the plugin advertises it among its supported versions, and prefers v1
# (the same messages with the same field numbers, in another package), so both are served and
# advertised. kubelet 1.36 ignores the names it does not know.
HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin", *HEALTH_SERVICES)
PLUGIN_TYPE = "DRAPlugin"
REGISTRATION_SERVICE = "pluginregistration.Registration"


class DRAService:
    def __init__(
        self,
        preparer: Preparer,
        before_unprepare: Callable[[ObjectRef], Awaitable[None]] | None = None,
        health: HealthBoard | None = None,
    ) -> None:
        self.preparer = preparer
        self.before_unprepare = before_unprepare
        self.health = health

    async def node_prepare_resources(
        self, request: dra.NodePrepareResourcesRequest, context: Any
    ) -> dra.NodePrepareResourcesResponse:
        with _measure("NodePrepareResources"):
            refs = [ObjectRef(c.namespace, c.name, c.uid) for c in request.claims]
            try:
                answers = await self.preparer.prepare_batch(refs)
            except Exception as exc:
                log.exception("prepare %s crashed", ", ".join(map(str, refs)))
                answers = [PrepareError(f"claim {r}: internal error: {exc}") for r in refs]
            response = dra.NodePrepareResourcesResponse()
            for ref, answer in zip(refs, answers, strict=True):
                response.claims[ref.uid].CopyFrom(self._answer(ref, answer))
            return response

    def _answer(
        self, ref: ObjectRef, prepared: PreparedClaim | PrepareError
    ) -> dra.NodePrepareResourceResponse:
        if isinstance(prepared, PrepareError):
            log.warning("prepare %s failed: %s", ref, prepared, extra={"claim": str(ref)})
            metrics.REQUESTS.labels("PrepareClaim", "error").inc()
            return dra.NodePrepareResourceResponse(error=str(prepared))
        metrics.REQUESTS.labels("PrepareClaim", "ok").inc()
        metrics.PREPARED_CLAIMS.set(len(self.preparer.checkpoint))
        return dra.NodePrepareResourceResponse(
            devices=[
                dra.Device(
                    request_names=[d.request],
                    pool_name=d.pool,
                    device_name=d.device,
                    cdi_device_ids=self.preparer.cdi_device_ids(prepared, d.request),
                )
                for d in prepared.devices
            ]
        )

    async def node_unprepare_resources(
        self, request: dra.NodeUnprepareResourcesRequest, context: Any
    ) -> dra.NodeUnprepareResourcesResponse:
        with _measure("NodeUnprepareResources"):
            response = dra.NodeUnprepareResourcesResponse()
            ready: list[ObjectRef] = []
            for claim in request.claims:  # each claim's interfaces gone, one claim at a time
                ref = ObjectRef(claim.namespace, claim.name, claim.uid)
                try:
                    with fields(claim=str(ref)):
                        if self.before_unprepare is not None:
                            await self.before_unprepare(ref)
                    ready.append(ref)
                except Exception as exc:
                    self._unprepare_failed(response, ref, exc)
            try:  # then those claims forgotten together (one change of each store)
                await self.preparer.unprepare_batch(ready)
            except Exception as exc:
                for ref in ready:
                    self._unprepare_failed(response, ref, exc)
            else:
                for ref in ready:
                    response.claims[ref.uid].CopyFrom(dra.NodeUnprepareResourceResponse())
            metrics.PREPARED_CLAIMS.set(len(self.preparer.checkpoint))
            return response

    @staticmethod
    def _unprepare_failed(
        response: dra.NodeUnprepareResourcesResponse, ref: ObjectRef, exc: Exception
    ) -> None:
        log.warning("unprepare %s failed: %s", ref, exc, extra={"claim": str(ref)})
        response.claims[ref.uid].CopyFrom(
            dra.NodeUnprepareResourceResponse(error=f"claim {ref}: {exc}")
        )

    def methods(self) -> Methods:
        """Both DRA versions' services and both health services, one implementation each."""
        dra_methods = {
            "NodePrepareResources": Method(
                self.node_prepare_resources,
                dra.NodePrepareResourcesRequest,
                dra.NodePrepareResourcesResponse,
            ),
            "NodeUnprepareResources": Method(
                self.node_unprepare_resources,
                dra.NodeUnprepareResourcesRequest,
                dra.NodeUnprepareResourcesResponse,
            ),
        }
        # the request is empty and the replies serialized once for both health services
        health_methods = {
            "NodeWatchResources": Method(self.node_watch_resources, bytes, bytes, stream=True)
        }
        methods: dict[str, Method] = {}
        for name in DRA_SERVICES:
            methods.update(service_methods(name, dra_methods))
        for name in HEALTH_SERVICES:
            methods.update(service_methods(name, health_methods))
        return methods

    async def node_watch_resources(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        """kubelet's device-health stream (KEP-4680): every published device's health at once,
        then again on each change and every HEALTH_REFRESH_SECONDS (kubelet takes a device it
        has not heard of for longer than its timeout as Unknown). kubelet shows it in the
        status of the containers using the device (allocatedResourcesStatus)."""
        if self.health is None:
            await asyncio.Event().wait()
        assert self.health is not None
        while True:
            yield health_report(self.preparer.node, self.health.devices).SerializeToString()
            await self.health.wait(HEALTH_REFRESH_SECONDS)


HEALTH_REFRESH_SECONDS = 20.0


def health_report(
    pool: str, devices: Mapping[str, str | None]
) -> health.NodeWatchResourcesResponse:
    now = int(time.time())
    return health.NodeWatchResourcesResponse(
        devices=[
            health.DeviceHealth(
                device=health.DeviceIdentifier(pool_name=pool, device_name=name),
                health=health.HEALTHY if failure is None else health.UNHEALTHY,
                last_updated_time=now,
                health_check_timeout_seconds=int(HEALTH_REFRESH_SECONDS * 3),
                message=(failure or "")[:1024],
            )
            for name, failure in sorted(devices.items())
        ]
    )


class _measure:
    def __init__(self, method: str) -> None:
        self.method = method

    def __enter__(self) -> None:
        self.start = time.perf_counter()

    def __exit__(self, exc_type: object, *_: object) -> None:
        metrics.LATENCY.labels(self.method).observe(time.perf_counter() - self.start)
        metrics.REQUESTS.labels(self.method, "error" if exc_type else "ok").inc()


class RegistrationService:
    """kubelet's plugin watcher finds our socket in plugins_registry and asks who we are."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.registered = asyncio.Event()
        self.error: str | None = None
        self.registrations = 0
        # called on each registration (the driver's publisher checks its slices are there)
        self.on_registered: Callable[[], None] | None = None

    async def GetInfo(self, request: reg.InfoRequest, context: Any) -> reg.PluginInfo:
        return reg.PluginInfo(
            type=PLUGIN_TYPE,
            name=DRIVER_NAME,
            endpoint=self.endpoint,
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    async def NotifyRegistrationStatus(
        self,
        request: reg.RegistrationStatus,
        context: Any,
    ) -> reg.RegistrationStatusResponse:
        if request.plugin_registered:
            self.registrations += 1
            self.error = None
            self.registered.set()
            log.info("kubelet registered the plugin (%d time(s))", self.registrations)
            if self.on_registered is not None:
                self.on_registered()
        else:
            self.error = request.error
            self.registered.clear()
            log.error("kubelet refused the plugin: %s", request.error)
        return reg.RegistrationStatusResponse()

    def methods(self) -> Methods:
        return service_methods(
            REGISTRATION_SERVICE,
            {
                "GetInfo": Method(self.GetInfo, reg.InfoRequest, reg.PluginInfo),
                "NotifyRegistrationStatus": Method(
                    self.NotifyRegistrationStatus,
                    reg.RegistrationStatus,
                    reg.RegistrationStatusResponse,
                ),
            },
        )
