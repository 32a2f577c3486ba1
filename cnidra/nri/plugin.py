"""An NRI plugin session with containerd: connect, register, serve the pod lifecycle hooks,
and reconnect with backoff when the runtime goes away."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from cnidra._proto.nri.v1alpha1 import api_pb2 as nri
from cnidra.nri.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, Mux
from cnidra.nri.ttrpc import UNKNOWN, Client, Handler, Server, TTRPCError
from cnidra.observe.logs import fields
from cnidra.util.backoff import Backoff

log = logging.getLogger(__name__)

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
DEFAULT_SOCKET = "/var/run/nri/nri.sock"
# CreateContainer is a safety net: a sandbox started while cnidra was not registered (a runtime
# or driver restart) gets its interfaces before its first container is created.
SUBSCRIBED = (
    nri.RUN_POD_SANDBOX,
    nri.STOP_POD_SANDBOX,
    nri.REMOVE_POD_SANDBOX,
    nri.CREATE_CONTAINER,
)


def event_mask(events: tuple[int, ...]) -> int:
    mask = 0
    for event in events:
        mask |= 1 << (event - 1)
    return mask


class RuntimeHooks(Protocol):
    """What the NRI plugin calls for each event it subscribed to (cnidra.nri.hooks.PodHooks)."""

    async def run_pod_sandbox(self, pod: nri.PodSandbox) -> None: ...
    async def stop_pod_sandbox(self, pod: nri.PodSandbox) -> None: ...
    async def remove_pod_sandbox(self, pod: nri.PodSandbox) -> None: ...
    async def synchronize(self, pods: list[nri.PodSandbox]) -> None: ...
    async def create_container(self, pod: nri.PodSandbox) -> None: ...
    def set_request_timeout(self, seconds: float) -> None: ...


class NRIPlugin:
    def __init__(
        self,
        hooks: RuntimeHooks,
        socket_path: str = DEFAULT_SOCKET,
        name: str = "cnidra",
        index: str = "50",
        register_timeout: float = 5.0,
    ) -> None:
        self.hooks = hooks
        self.socket_path = socket_path
        self.name = name
        self.index = index
        self.register_timeout = register_timeout
        self.connected = asyncio.Event()
        self.runtime: str | None = None
        self.request_timeout: float = 2.0
        self.sessions = 0
        self._sync_pods: list[nri.PodSandbox] = []
        self._background: set[asyncio.Task[None]] = set()
        self.last_error: str | None = None
        self._mux: Mux | None = None

    def reconnect(self) -> None:
        """Drop the connection; `run` connects again and the runtime synchronizes (SIGHUP)."""
        if self._mux is not None:
            log.info("dropping the NRI connection on request")
            task = asyncio.get_running_loop().create_task(self._mux.close())
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def run(self) -> None:
        """Stay connected forever; while disconnected the driver keeps serving kubelet."""
        backoff = Backoff(0.5, 10.0)
        while True:
            try:
                await self._session()
                backoff.reset()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning(
                    "NRI connection to %s failed: %s; connecting again",
                    self.socket_path,
                    self.last_error,
                )
            finally:
                self.connected.clear()
            await asyncio.sleep(backoff.next())

    async def _session(self) -> None:
        try:
            reader, writer = await asyncio.open_unix_connection(self.socket_path)
        except FileNotFoundError:
            raise ConnectionError(
                f"no NRI socket at {self.socket_path} (is NRI enabled?)"
            ) from None
        mux = Mux(reader, writer)
        self._mux = mux
        plugin_conn = mux.open(PLUGIN_SERVICE_CONN)
        runtime_conn = mux.open(RUNTIME_SERVICE_CONN)
        server = Server(
            plugin_conn,
            lambda data: mux.write(PLUGIN_SERVICE_CONN, data),
            {PLUGIN_SERVICE: self._handlers()},
        )
        client = Client(runtime_conn, lambda data: mux.write(RUNTIME_SERVICE_CONN, data))
        mux.start()
        serving = asyncio.create_task(server.serve(), name="nri-plugin-service")
        client.start()
        try:
            request = nri.RegisterPluginRequest(plugin_name=self.name, plugin_idx=self.index)
            await client.call(
                RUNTIME_SERVICE,
                "RegisterPlugin",
                request.SerializeToString(),
                deadline=self.register_timeout,
            )
            self.sessions += 1
            self.last_error = None
            self.connected.set()
            log.info("registered with the runtime over NRI as %s-%s", self.index, self.name)
            await mux.closed.wait()
            log.warning("the runtime closed the NRI connection")
        finally:
            self._mux = None
            self.connected.clear()
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
            await client.close()
            await mux.close()

    def _handlers(self) -> dict[str, Handler]:
        def unary(
            parse: Callable[[bytes], object], fn: Callable[[object], Awaitable[bytes]]
        ) -> Handler:
            async def handle(payload: bytes) -> bytes:
                return await fn(parse(payload))

            return handle

        return {
            "Configure": unary(nri.ConfigureRequest.FromString, self._configure),  # type: ignore[arg-type]
            "Synchronize": unary(nri.SynchronizeRequest.FromString, self._synchronize),  # type: ignore[arg-type]
            "Shutdown": unary(nri.Empty.FromString, self._shutdown),
            "RunPodSandbox": unary(nri.RunPodSandboxRequest.FromString, self._run),  # type: ignore[arg-type]
            "StopPodSandbox": unary(nri.StopPodSandboxRequest.FromString, self._stop),  # type: ignore[arg-type]
            "RemovePodSandbox": unary(nri.RemovePodSandboxRequest.FromString, self._remove),  # type: ignore[arg-type]
            "CreateContainer": unary(nri.CreateContainerRequest.FromString, self._create),  # type: ignore[arg-type]
        }

    async def _configure(self, req: nri.ConfigureRequest) -> bytes:
        self.runtime = f"{req.runtime_name} {req.runtime_version}".strip()
        if req.request_timeout:
            self.request_timeout = req.request_timeout / 1000
        self.hooks.set_request_timeout(self.request_timeout)
        log.info(
            "configured by %s (NRI %s), request timeout %.1fs",
            self.runtime,
            req.NRI_version or "?",
            self.request_timeout,
        )
        return nri.ConfigureResponse(events=event_mask(SUBSCRIBED)).SerializeToString()

    async def _synchronize(self, req: nri.SynchronizeRequest) -> bytes:
        self._sync_pods.extend(req.pods)
        if req.more:
            return nri.SynchronizeResponse(more=True).SerializeToString()
        pods, self._sync_pods = self._sync_pods, []
        # reconciling may DEL and GC: it runs after the answer, never against the runtime's timeout
        task = asyncio.create_task(self._reconcile(pods), name="nri-synchronize")
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return nri.SynchronizeResponse(more=False).SerializeToString()

    async def _reconcile(self, pods: list[nri.PodSandbox]) -> None:
        try:
            await self.hooks.synchronize(pods)
        except Exception:
            log.exception("reconciling with the runtime's %d pod(s) failed", len(pods))

    async def _shutdown(self, _: object) -> bytes:
        log.info("the runtime is shutting down")
        return nri.Empty().SerializeToString()

    async def _run(self, req: nri.RunPodSandboxRequest) -> bytes:
        await self._hook(self.hooks.run_pod_sandbox, req.pod)
        return nri.RunPodSandboxResponse().SerializeToString()

    async def _stop(self, req: nri.StopPodSandboxRequest) -> bytes:
        await self._hook(self.hooks.stop_pod_sandbox, req.pod)
        return nri.StopPodSandboxResponse().SerializeToString()

    async def _remove(self, req: nri.RemovePodSandboxRequest) -> bytes:
        await self._hook(self.hooks.remove_pod_sandbox, req.pod)
        return nri.RemovePodSandboxResponse().SerializeToString()

    async def _create(self, req: nri.CreateContainerRequest) -> bytes:
        await self._hook(self.hooks.create_container, req.pod)
        return nri.CreateContainerResponse().SerializeToString()

    async def _hook(
        self, fn: Callable[[nri.PodSandbox], Awaitable[None]], pod: nri.PodSandbox
    ) -> None:
        try:
            with fields(pod=f"{pod.namespace}/{pod.name}", sandbox=pod.id[:12]):
                await fn(pod)
        except TTRPCError:
            raise
        except Exception as exc:
            raise TTRPCError(UNKNOWN, str(exc)) from exc
