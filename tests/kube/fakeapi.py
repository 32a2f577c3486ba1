"""An apiserver in memory, served by an `aiohttp.web` application on 127.0.0.1 (an ephemeral
port, in a thread of its own with its own loop), for the driver's real client
(cnidra.kube.session's aiohttp session, counted as the driver counts): ResourceClaims, Pods and
Events with the semantics the driver relies on, each cited from Kubernetes 1.37's source where
it matters:

- a claim's status subresource keeps the object's metadata (finalizers included:
  `ResetObjectMetaForStatus`, apimachinery pkg/apis/meta/v1/helpers.go:265-276, called by the
  claim's status strategy, pkg/registry/resource/resourceclaim/strategy.go:197), and the main
  resource keeps the status (strategy.go:139): a finalizer and status.devices are two writes;
- server-side apply with a UID precondition answers 409 for a claim deleted and made again;
- deallocation (the claim controller clearing status.allocation, pkg/controller/resourceclaim/
  controller.go:1607) drops the status.devices of the devices deallocated (strategy.go:200,
  `dropDeallocatedStatusDevices`, 331-381);
- a pod's merge patch with metadata.resourceVersion is refused with 409 when it is stale;
- a JSON patch whose `test` fails is refused with 422 (apiserver pkg/endpoints/handlers/
  patch.go:423-425); a `test` for null passes on a missing member whose parent exists, and
  fails when the parent is missing (evanphx/json-patch v4.13.0 patch.go:678-691).

Every request is logged as (verb, resource, code)."""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from cnidra.kube.client import FIELD_MANAGER
from cnidra.kube.session import AsyncClient, KubeConfig
from cnidra.observe.metrics import request_kind

DRIVER = "cni.dra.networking.x-k8s.io"
NODE = "node-1"


@dataclass
class Request:
    """What the fake reads of a request."""

    method: str
    path: str
    query: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    content: bytes = b""


class LoopbackServer:
    """An aiohttp.web application served on 127.0.0.1 in a daemon thread (its own loop), so
    that a test's loop, whichever it is, reaches it over a real socket; `url`: where."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True, name="fake-apiserver")
        self.thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fake apiserver did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cpu(self) -> float:
        """Seconds of CPU the server's thread has spent (HTTP included, not only answering)."""
        assert self.thread.ident is not None
        return time.clock_gettime(time.pthread_getcpuclockid(self.thread.ident))

    def _serve(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        runner = web.AppRunner(self.app, access_log=None)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        server = site._server
        assert server is not None and server.sockets
        self.port = int(server.sockets[0].getsockname()[1])
        self._ready.set()
        loop.run_forever()


def a_client(url: str) -> AsyncClient:
    """The driver's client to a loopback apiserver (plain HTTP, a token as a real one's)."""
    return AsyncClient(KubeConfig(url, token="t"), 10.0, FIELD_MANAGER)


class Refused(Exception):
    def __init__(self, code: int, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason


def status_body(code: int, message: str, reason: str = "") -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _managed(manager: str, operation: str, subresource: str = "") -> dict[str, Any]:
    entry = {
        "manager": manager,
        "operation": operation,
        "apiVersion": "v1",
        "time": "2026-11-25T10:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:labels": {".": {}}}},
    }
    if subresource:
        entry["subresource"] = subresource
    return entry


def allocated_claim(
    namespace: str, name: str, uid: str, pod: str, pod_uid: str, configs: list[dict[str, Any]]
) -> dict[str, Any]:
    """A claim as the claim controller makes it from a template, allocated by the scheduler to
    NODE's device eth1 and reserved for its pod (the size of a real one: managed fields)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "resourceVersion": "1",
            "generation": 1,
            "creationTimestamp": "2026-11-25T10:00:00Z",
            "generateName": f"{pod}-dev-",
            "annotations": {"resource.kubernetes.io/pod-claim-name": "dev"},
            "finalizers": ["resource.kubernetes.io/delete-protection"],
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod,
                    "uid": pod_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                _managed("kube-controller-manager", "Update"),
                _managed("kube-scheduler", "Update", "status"),
            ],
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "dev",
                        "exactly": {
                            "deviceClassName": "cni.networking.x-k8s.io",
                            "allocationMode": "ExactCount",
                            "count": 1,
                        },
                    }
                ],
                "config": [c for c in configs if c.get("source") != "FromClass"],
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "dev", "driver": DRIVER, "pool": NODE, "device": "eth1"}
                    ],
                    "config": configs,
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [NODE]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": pod, "uid": pod_uid}],
        },
    }


def a_pod(namespace: str, name: str, uid: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "resourceVersion": "1",
            "creationTimestamp": "2026-11-25T10:00:00Z",
            "labels": {"app": "bench"},
            **({"annotations": dict(annotations)} if annotations else {}),
            "managedFields": [_managed("kubectl", "Apply"), _managed("kubelet", "Update")],
        },
        "spec": {
            "nodeName": NODE,
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "command": ["sleep", "3600"],
                    "resources": {"claims": [{"name": "dev"}]},
                }
            ],
            "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": "cnidra"}],
        },
        "status": {"phase": "Running", "podIP": "10.0.0.5"},
    }


class FakeApiserver:
    """Claims and pods by (namespace, name); Events as created. `log`: every request's
    (verb, resource, code), the driver's counter's labels."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.log: list[tuple[str, str, int]] = []
        self.version = 1
        self._server: LoopbackServer | None = None

    def client(self) -> AsyncClient:
        """The driver's client (its aiohttp session, counted as the driver counts) to this
        apiserver, served on loopback from the first call on."""
        if self._server is None:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._serve)
            self._server = LoopbackServer(app)
        return a_client(self._server.url)

    async def _serve(self, request: web.Request) -> web.Response:
        content = await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        code, body = self.handle(
            Request(request.method, request.path, request.query_string, headers, content)
        )
        if isinstance(body, bytes):  # a stream, as written (a watch's lines)
            return web.Response(body=body, status=code, content_type="application/json")
        return web.json_response(body, status=code)

    # -- what other actors do

    def deallocate(self, namespace: str, name: str) -> None:
        """The claim controller once the claim's last pod is gone: allocation cleared, and the
        status strategy drops the status.devices of the deallocated devices."""
        claim = self.claims[namespace, name]
        results = claim["status"]["allocation"]["devices"]["results"]
        gone = {(r["driver"], r["pool"], r["device"], r.get("shareID") or "") for r in results}
        status = claim["status"]
        status.pop("allocation", None)
        status["reservedFor"] = []
        devices = [
            d
            for d in status.get("devices") or []
            if (d["driver"], d["pool"], d["device"], d.get("shareID") or "") not in gone
        ]
        if devices:
            status["devices"] = devices
        else:
            status.pop("devices", None)
        self._bump(claim)

    def delete_claim(self, namespace: str, name: str) -> None:
        """Deleted: gone at once unless a finalizer other than the controller's holds it."""
        claim = self.claims[namespace, name]
        held = [
            f
            for f in claim["metadata"].get("finalizers") or []
            if not f.startswith("resource.kubernetes.io/")
        ]
        if held:
            claim["metadata"]["deletionTimestamp"] = "2026-11-25T10:01:00Z"
            claim["metadata"]["finalizers"] = held
            self._bump(claim)
        else:
            del self.claims[namespace, name]

    def _bump(self, obj: dict[str, Any]) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)

    # -- the HTTP side

    @property
    def cpu(self) -> float:
        """Seconds of CPU spent serving (the apiserver's thread, HTTP included: not the
        client's)."""
        return 0.0 if self._server is None else self._server.cpu()

    def handle(self, request: Request) -> tuple[int, Any]:
        """(code, body): a dict as JSON, bytes as they are."""
        return self._handle(request)

    def _handle(self, request: Request) -> tuple[int, dict[str, Any]]:
        verb, resource = request_kind(
            request.method, request.path, request.query, request.headers.get("content-type", "")
        )
        try:
            code, body = self._answer(request, resource)
        except Refused as exc:
            code, body = exc.code, status_body(exc.code, str(exc), exc.reason)
        self.log.append((verb, resource, code))
        return code, body

    def _answer(self, request: Request, resource: str) -> tuple[int, dict[str, Any]]:
        parts = request.path.strip("/").split("/")
        namespace = parts[parts.index("namespaces") + 1]
        kind = parts[parts.index("namespaces") + 2]
        name = (
            parts[parts.index("namespaces") + 3]
            if len(parts) > parts.index("namespaces") + 3
            else ""
        )
        body = json.loads(request.content) if request.content else None
        if kind == "events" and request.method == "POST":
            assert isinstance(body, dict)
            body.setdefault("metadata", {})["name"] = f"ev{len(self.events)}"
            self.events.append(body)
            return 201, body
        if kind == "resourceclaims":
            return self._claim(request.method, resource, namespace, name, body)
        if kind == "pods":
            return self._pod(request, namespace, name, body)
        raise Refused(404, f"{kind} not served here", "NotFound")

    def _claim(
        self, method: str, resource: str, namespace: str, name: str, body: Any
    ) -> tuple[int, dict[str, Any]]:
        claim = self.claims.get((namespace, name))
        if claim is None:
            raise Refused(404, f'resourceclaims.resource.k8s.io "{name}" not found', "NotFound")
        if method == "GET":
            return 200, copy.deepcopy(claim)
        assert method == "PATCH" and isinstance(body, dict)
        uid = body.get("metadata", {}).get("uid")
        if uid and uid != claim["metadata"]["uid"]:
            raise Refused(
                409,
                f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
                f"{claim['metadata']['uid']}",
                "Conflict",
            )
        if resource.endswith("/status"):
            # metadata, finalizers included, is the object's (ResetObjectMetaForStatus)
            ours = [d for d in (body.get("status") or {}).get("devices") or []]
            others = [d for d in claim["status"].get("devices") or [] if d["driver"] != DRIVER]
            if ours or others:
                claim["status"]["devices"] = others + ours
            else:
                claim["status"].pop("devices", None)
        else:
            # the main resource keeps the status; cnidra-detach's finalizer as applied
            wanted = body.get("metadata", {}).get("finalizers") or []
            current = [
                f for f in claim["metadata"].get("finalizers") or [] if not f.startswith(DRIVER)
            ]
            if wanted and claim["metadata"].get("deletionTimestamp"):
                mine = [f for f in wanted if f not in (claim["metadata"].get("finalizers") or [])]
                if mine:
                    message = "no new finalizers can be added if the object is being deleted"
                    raise Refused(422, f"Forbidden: {message}", "Invalid")
            claim["metadata"]["finalizers"] = current + list(wanted)
            if claim["metadata"].get("deletionTimestamp") and not claim["metadata"]["finalizers"]:
                del self.claims[namespace, name]
                return 200, claim
        self._bump(claim)
        return 200, copy.deepcopy(claim)

    def _pod(
        self, request: Request, namespace: str, name: str, body: Any
    ) -> tuple[int, dict[str, Any]]:
        pod = self.pods.get((namespace, name))
        if pod is None:
            raise Refused(404, f'pods "{name}" not found', "NotFound")
        if request.method == "GET":
            return 200, copy.deepcopy(pod)
        assert request.method == "PATCH"
        kind = request.headers.get("content-type", "")
        if kind.startswith("application/json-patch+json"):
            assert isinstance(body, list)
            patched = apply_json_patch(pod, body)
        elif kind.startswith("application/merge-patch+json"):
            assert isinstance(body, dict)
            version = body.get("metadata", {}).get("resourceVersion")
            if version is not None and version != pod["metadata"]["resourceVersion"]:
                raise Refused(
                    409,
                    f'Operation cannot be fulfilled on pods "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                    "Conflict",
                )
            patched = copy.deepcopy(pod)
            annotations = body.get("metadata", {}).get("annotations") or {}
            if annotations:
                patched["metadata"].setdefault("annotations", {}).update(annotations)
        else:
            raise Refused(415, f"patch type {kind} not supported here", "UnsupportedMediaType")
        self.pods[namespace, name] = patched
        self._bump(patched)
        return 200, copy.deepcopy(patched)


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def apply_json_patch(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 for objects (test, add, replace, remove), as evanphx/json-patch v4 tests: a
    null value tests for a missing member of an existing parent."""
    doc = copy.deepcopy(obj)
    for op in ops:
        *parents, key = _pointer(op["path"])
        parent: Any = doc
        for part in parents:
            if not isinstance(parent, dict) or part not in parent:
                raise Refused(
                    422, f"{op['op']} operation does not apply: is missing path: {op['path']}"
                )
            parent = parent[part]
        if not isinstance(parent, dict):
            raise Refused(422, f"{op['path']}: not an object")
        if op["op"] == "test":
            if parent.get(key) != op.get("value"):
                raise Refused(422, f"testing value {op['path']} failed: test failed")
        elif op["op"] in ("add", "replace"):
            if op["op"] == "replace" and key not in parent:
                raise Refused(
                    422, f"replace operation does not apply: doc is missing key: {op['path']}"
                )
            parent[key] = copy.deepcopy(op["value"])
        elif op["op"] == "remove":
            if key not in parent:
                raise Refused(422, f"remove operation does not apply: {op['path']}")
            del parent[key]
        else:
            raise Refused(422, f"unsupported op {op['op']}")
    return doc
