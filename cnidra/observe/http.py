"""GET /healthz (JSON, 200 or 503) and GET /metrics (Prometheus), served by the standard
library's threaded HTTP server beside the event loop: a probe is answered even while the loop
is busy, and the loop never parses HTTP."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from cnidra.observe.metrics import REGISTRY

log = logging.getLogger(__name__)

HealthCheck = Callable[[], tuple[bool, dict[str, Any]]]


class HTTPEndpoint:
    def __init__(self, address: str, health: HealthCheck) -> None:
        host, _, port = address.rpartition(":")
        check = health

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.startswith("/healthz"):
                    ok, details = check()
                    body = json.dumps({"ok": ok, **details}, indent=1, default=str).encode()
                    self._send(200 if ok else 503, "application/json", body)
                elif self.path.startswith("/metrics"):
                    self._send(200, CONTENT_TYPE_LATEST, generate_latest(REGISTRY))
                else:
                    self._send(404, "text/plain", b"not found\n")

            def _send(self, code: int, content_type: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("http: " + format, *args)

        self.server = ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler)
        self.server.daemon_threads = True
        self.server.timeout = 5
        self._thread = threading.Thread(target=self.server.serve_forever, name="http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
