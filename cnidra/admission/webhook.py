"""`cnidra webhook`: a validating admission webhook for ResourceClaims and
ResourceClaimTemplates, so a claim the driver would refuse is refused before any pod uses it,
with the same verdict (`cnidra.api.validate` with the DeviceClasses' CNIPolicy) and messages
that name the field.

It reads the DeviceClasses a claim names and the namespace's labels from the apiserver (short
caches); everything else is the pure validator. Prepare checks everything again: admission
can be bypassed (a webhook down with failurePolicy Ignore, objects created before it)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import uvicorn

from cnidra.api.claimspec import devices_of, read_spec
from cnidra.api.issues import Issues, Severity
from cnidra.api.loading import LoadError, load_json
from cnidra.api.validate import validate_documents
from cnidra.observe.http import BoundedServer

log = logging.getLogger(__name__)

MAX_BODY = 3 * 1024 * 1024  # the apiserver's own request limit
MESSAGE_MAX = 4096
MAX_CLASSES = 32  # distinct DeviceClasses one claim may name (DRA allows 32 requests)
CACHE_MAX = 1024  # DeviceClasses and namespaces kept; a flood of names cannot grow it further
REVIEW_WORKERS = 4  # reviews at once (CPU-bound; more threads only contend for the GIL)
MAX_CONNECTIONS = 2048  # open connections and requests at once; beyond, 503 at once
KEEP_ALIVE_SECONDS = 30  # an idle kept-alive connection is closed after this
HEAD_SECONDS = 10.0  # a new connection's first request head must arrive within this
BODY_SECONDS = 10.0  # a request body that has not wholly arrived within this is refused

Lookup = Callable[[str], Mapping[str, Any] | None]


def device_classes_of(obj: Mapping[str, Any]) -> set[str]:
    """The DeviceClasses a claim's (or a template's) requests name, read by the one reader of
    a claim's spec; what it cannot read is the validator's to tell."""
    devices, path = devices_of(obj)
    if not isinstance(devices, Mapping):
        return set()
    return read_spec(devices, path, Issues(), bounded=False).device_classes


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
        names = sorted(device_classes_of(obj))
        if len(names) > MAX_CLASSES:  # each is a lookup: a claim may not fan out without bound
            message = (
                f"cnidra: spec.devices.requests: names {len(names)} DeviceClasses; a claim "
                f"checked by cnidra may name at most {MAX_CLASSES}"
            )
            return _answer(uid, False, message, [])
        found = {name: device_class(name) for name in names}
        classes = [c for c in found.values() if c]
        labels = namespace_labels(namespace) if namespace else {}
        [report] = validate_documents([obj], classes, dict(labels or {}))
        errors = [i for i in report.issues.items if i.severity is Severity.ERROR]
        # a class that cannot be read is a missing fact: refused, not admitted unchecked
        missing = [name for name, cls in found.items() if not cls]
        if missing:
            message = (
                f"cnidra: spec.devices.requests: DeviceClass(es) {', '.join(missing)} not found; "
                "a claim with a cnidra config is checked against its class's CNIPolicy, so the "
                "class must exist first"
            )
            return _answer(uid, False, message, [])
        warnings = [
            f"{i.path}: {i.message}"[:512]
            for i in report.issues.items
            if i.severity is Severity.WARNING
        ]
        if errors:
            allowed = False
            message = "cnidra: " + "; ".join(f"{i.path}: {i.message}" for i in errors)
    return _answer(uid, allowed, message, warnings)


def _answer(uid: str, allowed: bool, message: str, warnings: list[str]) -> dict[str, Any]:
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
        if value is not None:  # a miss is asked again: the object may be created any moment
            with self._lock:
                self._items[key] = (now, value)
                if len(self._items) > CACHE_MAX:  # bounded: drop the oldest
                    del self._items[min(self._items, key=lambda k: self._items[k][0])]
        return value


class WebhookServer:
    """The webhook on uvicorn (a maintained ASGI server): TLS handshakes run on the event loop,
    one per connection, never in the accept path; an idle or slow connection holds nothing but
    its own socket (handshake and keep-alive timeouts close it); reviews run on a bounded pool
    of threads, so a burst queues instead of starving the loop."""

    def __init__(
        self,
        address: str,
        cert: str,
        key: str,
        device_class: Lookup,
        namespace_labels: Lookup,
        *,
        workers: int = REVIEW_WORKERS,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        host, _, port = address.rpartition(":")
        self._app = _App(device_class, namespace_labels, workers)
        self.config = uvicorn.Config(
            self._app,
            host=host or "0.0.0.0",
            port=int(port),
            ssl_certfile=cert,
            ssl_keyfile=key,
            lifespan="off",
            log_config=None,
            access_log=False,
            server_header=False,
            timeout_keep_alive=KEEP_ALIVE_SECONDS,
            timeout_graceful_shutdown=5,
            limit_concurrency=max_connections,
            h11_max_incomplete_event_size=64 * 1024,
        )
        self.server = BoundedServer(
            self.config, head_seconds=HEAD_SECONDS, keep_alive_seconds=KEEP_ALIVE_SECONDS
        )

    @property
    def port(self) -> int:
        for server in getattr(self.server, "servers", []):
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return int(self.config.port)

    def serve_forever(self) -> None:
        self.server.run()

    def start(self, timeout: float = 10.0) -> threading.Thread:
        """Serve on a thread (tests, benchmarks); returns once listening."""
        thread = threading.Thread(target=self.serve_forever, name="webhook", daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the webhook did not start")
            time.sleep(0.02)
        return thread

    def shutdown(self) -> None:
        self.server.should_exit = True


class _App:
    """POST /validate (any POST path): an AdmissionReview; GET /healthz."""

    def __init__(self, device_class: Lookup, namespace_labels: Lookup, workers: int) -> None:
        self.lookups = (device_class, namespace_labels)
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="review")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] == "GET":
            ok = scope["path"].startswith("/healthz")
            await _send(send, 200 if ok else 404, {"ok": ok})
            return
        if scope["method"] != "POST":
            await _send(send, 405, {"error": "POST an AdmissionReview"})
            return
        raw = bytearray()
        deadline = asyncio.get_running_loop().time() + BODY_SECONDS
        while True:  # the whole body within BODY_SECONDS: a trickle cannot hold a connection
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                await _send(send, 408, {"error": "the request body was too slow"})
                return
            raw += message.get("body", b"")
            if len(raw) > MAX_BODY:
                await _send(send, 413, {"error": "request too large"})
                return
            if not message.get("more_body"):
                break
        loop = asyncio.get_running_loop()
        code, answer = await loop.run_in_executor(self.pool, self.answer, bytes(raw))
        await _send(send, code, answer)

    def answer(self, raw: bytes) -> tuple[int, dict[str, Any]]:
        try:
            body = load_json(raw, "the AdmissionReview")
        except LoadError as exc:  # refused, not failed: a failure would be failurePolicy's
            return 200, denied("", str(exc))
        if not isinstance(body, Mapping):
            return 200, denied("", "the AdmissionReview must be a JSON object")
        request = body.get("request")
        uid = str(request.get("uid", "")) if isinstance(request, Mapping) else ""
        try:
            return 200, review(body, *self.lookups)
        except Exception as exc:
            log.exception("reviewing %s failed", uid)
            return 200, denied(uid, f"internal error: {exc}")


async def _send(send: Any, code: int, payload: Mapping[str, Any]) -> None:
    data = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": code,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})
