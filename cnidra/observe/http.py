"""GET /healthz (JSON, 200 or 503) and GET /metrics (Prometheus), served by uvicorn (a
maintained server) on its own thread and event loop beside the driver's: a probe is answered
even while the driver's loop is busy, and the driver's loop never parses HTTP. Connections are
bounded (a request over the limit gets 503), an idle keep-alive connection is closed after a
few seconds, and one whose request head does not arrive in time is cut off, so idle or slow
clients hold a socket each for seconds, never a thread: 500 held connections leave the thread
count unchanged and are all closed within HEAD_TIMEOUT_SECONDS."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from cnidra.observe.metrics import REGISTRY
from cnidra.util.lazy import defer_init

# uvicorn's server and its config, not its command line: uvicorn's `__init__` imports
# `uvicorn.main` (click, the reload supervisors, multiprocessing; 1.3 MiB of the driver's
# resident memory) for its `run`; its own modules import `Config` from the package
defer_init("uvicorn", {"Config": "config", "Server": "server"})
from uvicorn.config import Config  # noqa: E402
from uvicorn.server import Server  # noqa: E402

log = logging.getLogger(__name__)

HealthCheck = Callable[[], tuple[bool, dict[str, Any]]]
MAX_CONNECTIONS = 1024  # beyond, uvicorn answers 503; idle ones are closed within seconds
KEEP_ALIVE_SECONDS = 5
HEAD_TIMEOUT_SECONDS = 5.0  # a request line and headers must arrive within this


class HTTPEndpoint:
    def __init__(
        self, address: str, health: HealthCheck, *, max_connections: int = MAX_CONNECTIONS
    ) -> None:
        host, _, port = address.rpartition(":")
        self.address = address
        self.config = Config(
            _App(health),
            host=host or "0.0.0.0",
            port=int(port),
            lifespan="off",
            log_config=None,
            access_log=False,
            server_header=False,
            date_header=False,
            timeout_keep_alive=KEEP_ALIVE_SECONDS,
            timeout_graceful_shutdown=2,
            limit_concurrency=max_connections,
            h11_max_incomplete_event_size=16 * 1024,
            http="h11",
        )
        self.server = BoundedServer(
            self.config,
            head_seconds=HEAD_TIMEOUT_SECONDS,
            keep_alive_seconds=KEEP_ALIVE_SECONDS,
        )  # on its own thread: uvicorn leaves the process's signals (the driver's) alone
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        for server in getattr(self.server, "servers", []):
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return int(self.config.port)

    def start(self, timeout: float = 10.0) -> None:
        """Serve on a thread; return once listening, or raise naming the address."""
        self._thread = threading.Thread(target=self._serve, name="http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(
                    f"health and metrics endpoint could not listen on {self.address}"
                )
            time.sleep(0.02)
        log.info("health and metrics on http://%s", self.address)

    def _serve(self) -> None:
        with contextlib.suppress(SystemExit):  # uvicorn exits when it cannot bind: start() says
            self.server.run()

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)


class BoundedServer(Server):
    """uvicorn's server, with connections that hold a socket without asking anything closed:
    uvicorn's keep-alive timer covers only a connection idle after a response, and stops at the
    first byte of a next request, so a client that connects (and completes TLS) and then sends
    nothing, or half a request head, would hold its connection (one of the connection limit)
    for ever. Shared by /healthz and /metrics and the admission webhook."""

    def __init__(
        self,
        config: Config,
        *,
        head_seconds: float,
        keep_alive_seconds: float,
    ) -> None:
        super().__init__(config)
        self.head_seconds = head_seconds
        self.keep_alive_seconds = keep_alive_seconds

    async def main_loop(self) -> None:
        sweeper = asyncio.get_running_loop().create_task(self._sweep())
        try:
            await super().main_loop()
        finally:
            sweeper.cancel()

    async def _sweep(self) -> None:
        """Close a connection with no request in flight whose next request head has not
        arrived in time: head_seconds for a connection that never sent one, keep_alive_seconds
        (plus head_seconds) after the last response. A request in flight is the app's to
        bound."""
        waiting: dict[int, tuple[object, float]] = {}
        while True:
            await asyncio.sleep(min(0.5, self.head_seconds / 4))
            now = time.monotonic()
            alive = set()
            for connection in list(self.server_state.connections):
                key = id(connection)
                alive.add(key)
                cycle = getattr(connection, "cycle", None)
                if cycle is not None and not getattr(cycle, "response_complete", False):
                    waiting.pop(key, None)  # a request being read or answered
                    continue
                seen = waiting.get(key)
                if seen is None or seen[0] is not cycle:
                    waiting[key] = (cycle, now)
                    continue
                limit = self.head_seconds + (0 if cycle is None else self.keep_alive_seconds)
                if now - seen[1] > limit:
                    transport = getattr(connection, "transport", None)
                    if transport is not None:  # not close(): TLS's would wait for the client
                        transport.abort()
            for key in set(waiting) - alive:
                del waiting[key]


class _App:
    def __init__(self, health: HealthCheck) -> None:
        self.health = health

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] not in ("GET", "HEAD"):
            await _send(send, 405, "text/plain", b"GET /healthz or /metrics\n")
            return
        path = scope["path"]
        if path.startswith("/healthz"):
            ok, details = self.health()
            body = json.dumps({"ok": ok, **details}, indent=1, default=str).encode()
            await _send(send, 200 if ok else 503, "application/json", body)
        elif path.startswith("/metrics"):
            await _send(send, 200, CONTENT_TYPE_LATEST, generate_latest(REGISTRY))
        else:
            await _send(send, 404, "text/plain", b"not found\n")


async def _send(send: Any, status: int, content_type: str, body: bytes) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
