"""`cnidra webhook`: a validating admission webhook for ResourceClaims and
ResourceClaimTemplates, so a claim the driver would refuse is refused before any pod uses it,
with the same verdict (`cnidra.api.validate` with the DeviceClasses' CNIPolicy) and messages
that name the field.

It reads the DeviceClasses a claim names and the namespace's labels from the apiserver (short
caches); everything else is the pure validator. Prepare checks everything again: admission
can be bypassed (a webhook down with failurePolicy Ignore, objects created before it)."""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cnidra.api.issues import Severity
from cnidra.api.validate import validate_documents

log = logging.getLogger(__name__)

MAX_BODY = 3 * 1024 * 1024  # the apiserver's own request limit
MAX_DEPTH = 64
MESSAGE_MAX = 4096

Lookup = Callable[[str], Mapping[str, Any] | None]


def depth_ok(value: Any, limit: int = MAX_DEPTH) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return False
        if isinstance(item, Mapping):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return True


def device_classes_of(obj: Mapping[str, Any]) -> set[str]:
    spec = obj.get("spec") or {}
    if obj.get("kind") == "ResourceClaimTemplate":
        spec = (spec.get("spec") or {}) if isinstance(spec, Mapping) else {}
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    names: set[str] = set()
    for req in requests if isinstance(requests, list) else []:
        if not isinstance(req, Mapping):
            continue
        exactly: Mapping[str, Any] = (
            req["exactly"] if isinstance(req.get("exactly"), Mapping) else req
        )
        if isinstance(exactly.get("deviceClassName"), str):
            names.add(exactly["deviceClassName"])
        for sub in req.get("firstAvailable") or []:
            if isinstance(sub, Mapping) and isinstance(sub.get("deviceClassName"), str):
                names.add(sub["deviceClassName"])
    return names


def review(
    body: Mapping[str, Any], device_class: Lookup, namespace_labels: Lookup
) -> dict[str, Any]:
    """The AdmissionReview answer for one request."""
    request = body.get("request") or {}
    uid = request.get("uid", "")
    obj = request.get("object")
    allowed, message, warnings = True, "", []
    if request.get("operation") in ("CREATE", "UPDATE") and isinstance(obj, Mapping):
        namespace = request.get("namespace") or (obj.get("metadata") or {}).get("namespace")
        obj = {**obj, "metadata": {**(obj.get("metadata") or {}), "namespace": namespace}}
        classes = [c for c in map(device_class, sorted(device_classes_of(obj))) if c]
        labels = namespace_labels(namespace) if namespace else {}
        [report] = validate_documents([obj], classes, dict(labels or {}))
        errors = [i for i in report.issues.items if i.severity is Severity.ERROR]
        warnings = [
            f"{i.path}: {i.message}"[:512]
            for i in report.issues.items
            if i.severity is Severity.WARNING
        ]
        if errors:
            allowed = False
            message = "cnidra: " + "; ".join(f"{i.path}: {i.message}" for i in errors)
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if not allowed:
        response["status"] = {"code": 422, "reason": "Invalid", "message": message[:MESSAGE_MAX]}
    if warnings:
        response["warnings"] = warnings[:20]
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def denied(uid: str, message: str) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {
            "uid": uid,
            "allowed": False,
            "status": {"code": 422, "reason": "Invalid", "message": f"cnidra: {message}"},
        },
    }


class TTLCache:
    """Values read from the apiserver, kept for `ttl` seconds (classes and namespace labels
    change rarely; a stale answer for a few seconds is the same as a slower webhook)."""

    def __init__(self, read: Lookup, ttl: float = 10.0) -> None:
        self.read = read
        self.ttl = ttl
        self._items: dict[str, tuple[float, Mapping[str, Any] | None]] = {}
        self._lock = threading.Lock()

    def __call__(self, key: str) -> Mapping[str, Any] | None:
        now = time.monotonic()
        with self._lock:
            hit = self._items.get(key)
        if hit and now - hit[0] < self.ttl:
            return hit[1]
        value = self.read(key)
        with self._lock:
            self._items[key] = (now, value)
        return value


class WebhookServer:
    def __init__(
        self,
        address: str,
        cert: str,
        key: str,
        device_class: Lookup,
        namespace_labels: Lookup,
    ) -> None:
        host, _, port = address.rpartition(":")
        lookups = (device_class, namespace_labels)

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    self._send(413, {"error": "request too large"})
                    return
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except RecursionError:
                    self._send(200, denied("", "the object is nested too deeply"))
                    return
                except ValueError:
                    self._send(400, {"error": "not JSON"})
                    return
                uid = str(((body or {}).get("request") or {}).get("uid", ""))
                if not depth_ok(body):
                    self._send(200, denied(uid, f"the object is nested more than {MAX_DEPTH} deep"))
                    return
                try:
                    self._send(200, review(body, *lookups))
                except Exception as exc:
                    log.exception("reviewing %s failed", uid)
                    self._send(200, denied(uid, f"internal error: {exc}"))

            def do_GET(self) -> None:
                self._send(200 if self.path.startswith("/healthz") else 404, {"ok": True})

            def _send(self, code: int, payload: Mapping[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("webhook: " + format, *args)

        self.server = ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler)
        self.server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def serve_forever(self) -> None:
        self.server.serve_forever()

    def shutdown(self) -> None:
        self.server.shutdown()
        self.server.server_close()
