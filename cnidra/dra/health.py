"""A small HTTP endpoint: GET /healthz (JSON, 200 or 503) and GET /metrics (Prometheus)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from cnidra.dra.metrics import REGISTRY

log = logging.getLogger(__name__)

HealthCheck = Callable[[], tuple[bool, dict[str, Any]]]


async def serve_http(address: str, health: HealthCheck) -> asyncio.Server:
    host, _, port = address.rpartition(":")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(5):
                request_line = await reader.readline()
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
            parts = request_line.decode("latin-1").split()
            path = parts[1] if len(parts) >= 2 else "/"
            if path.startswith("/healthz"):
                ok, details = health()
                body = json.dumps({"ok": ok, **details}, indent=1).encode()
                status, ctype = ("200 OK" if ok else "503 Service Unavailable"), "application/json"
            elif path.startswith("/metrics"):
                body, status, ctype = generate_latest(REGISTRY), "200 OK", CONTENT_TYPE_LATEST
            else:
                body, status, ctype = b"not found\n", "404 Not Found", "text/plain"
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: "
                f"{len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host or "0.0.0.0", int(port))
