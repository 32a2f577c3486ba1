"""The wire below `cnidra.kube.api.Api`: the apiserver's address and credentials (a kubeconfig
or the in-cluster service account), the resource kinds as paths, and one aiohttp session that
carries every request on plain dicts.

aiohttp alone, chosen by measurement (bench.transport, docs/performance.md "The apiserver
client's transport"): 0.26/0.41 ms of CPU per GET/apply through Api against lightkube on
httpx2's 0.75/1.09 ms. HTTP/1.1 keep-alive over at most `limit` connections for requests
(prepare's APISERVER_SLOTS) and WATCHES more, each idle one kept `KEEPALIVE` seconds so that a
node's bursts reuse their TLS sessions. A watch holds a connection of its own for as long as it
streams, as every HTTP/1.1 request does: nothing queues behind it (requests queued behind
watches on the one HTTP/2 connection of the client before).

Every answer is counted here (cnidra_apiserver_requests_total, by verb, resource and code);
every failure is raised as the one table's ApiFailure (cnidra.kube.api.classify)."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import random
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import aiohttp
import yaml

from cnidra.observe import metrics

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
KEEPALIVE = 60.0  # seconds an idle connection is kept (>= 30 s: a burst's TLS sessions reused)
# connections for requests at most (more wait for one): each holds a TLS session and its
# buffers (measured, bench.driver_latency with 1,000 prepared claims: VmRSS 101.7 MiB with 32,
# 94.9 with 8; 100 claims' GETs p50 523 and 555 ms)
LIMIT = 8
# connections the watches may hold beside them: the driver holds up to 10 (CNINetworks, its
# node's pods, DeviceClasses, network policy's 4 kinds, the pool accountant's 3), each on a
# connection of its own for as long as it streams
WATCHES = 16
TOKEN_REREAD = 60.0  # seconds: a projected service-account token is rotated under the pod
# the apiserver ends a watch after a time drawn in [WATCH_SECONDS, 2 x WATCH_SECONDS), as
# client-go's reflectors ask (their minWatchTimeout is 5 minutes): watched again from where it
# was; the spread keeps a fleet's watches from reopening together
WATCH_SECONDS = 300
EMPTY_WATCH = 1.0  # seconds: a watch that ends sooner with no event is a failure
ALL_NAMESPACES = "*"


class ApiStatus(Exception):
    """An apiserver's failure answer (or none: code None), before cnidra.kube.api's table
    names its kind."""

    def __init__(self, code: int | None, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after = retry_after


# ----------------------------------------------------------------------------- kinds


@dataclass(frozen=True)
class Resource:
    """A kind as the apiserver serves it: its group, version, kind, plural, whether it is
    namespaced; `subresource` ("status") for the status writes."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    subresource: str = ""

    @property
    def Status(self) -> Resource:
        """The kind's status subresource."""
        return replace(self, subresource="status")

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def typed(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """`body` with its apiVersion and kind (the kind's, when it names none): a create or
        an apply without them is refused."""
        return {"apiVersion": self.api_version, "kind": self.kind, **body}

    def path(self, namespace: str | None, name: str | None = None) -> str:
        """The URL path of the collection (`name` None) or of one object, in `namespace`
        (None or "*" for a namespaced kind: every namespace)."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace not in (None, ALL_NAMESPACES):
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
            if self.subresource:
                base += f"/{self.subresource}"
        return base


def namespaced(group: str, version: str, kind: str, plural: str) -> Resource:
    return Resource(group, version, kind, plural, True)


def cluster_wide(group: str, version: str, kind: str, plural: str) -> Resource:
    return Resource(group, version, kind, plural, False)


def selector(terms: Mapping[str, Any]) -> str:
    """A label or field selector from {key: value}: a value None or ... means the key exists
    (labels only); a list or tuple, any of its values."""
    parts = []
    for key, value in terms.items():
        if value is None or value is Ellipsis:
            parts.append(key)
        elif isinstance(value, list | tuple | set | frozenset):
            parts.append(f"{key} in ({','.join(sorted(str(v) for v in value))})")
        else:
            parts.append(f"{key}={value}")
    return ",".join(parts)


# ----------------------------------------------------------------------------- config


class ConfigError(Exception):
    """A kubeconfig or service account that cannot be used: the message says why."""


@dataclass
class KubeConfig:
    """Where the apiserver is and how to be known to it: `server` (https://...), the TLS
    context (None for plain http: the tests' loopback apiserver), a bearer token (or a file
    to read it from, read again every TOKEN_REREAD seconds) and the default namespace."""

    server: str  # the URL the API's paths are appended to (a trailing / dropped)
    ssl_context: ssl.SSLContext | None = None
    token: str | None = None
    token_file: Path | None = None
    namespace: str = "default"
    # a kubeconfig user's `exec` credential plugin (client.authentication.k8s.io): run for a
    # token when there is none or it expired, as kubectl runs it
    exec_plugin: Mapping[str, Any] | None = None
    _read_at: float = field(default=0.0, repr=False)
    _expires: float | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.server = self.server.rstrip("/")

    def authorization(self) -> str | None:
        """The Authorization header, None without a token."""
        if self.token_file is not None and time.monotonic() - self._read_at > TOKEN_REREAD:
            with contextlib.suppress(OSError):
                self.token = self.token_file.read_text().strip()
                self._read_at = time.monotonic()
        if self.exec_plugin is not None and (
            self.token is None or (self._expires is not None and time.time() > self._expires)
        ):
            self.token, self._expires = _exec_token(self.exec_plugin)
        return f"Bearer {self.token}" if self.token else None

    @classmethod
    def from_service_account(cls, root: Path = SERVICE_ACCOUNT) -> KubeConfig:
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise ConfigError("KUBERNETES_SERVICE_HOST is not set")
        if not (root / "token").is_file():
            raise ConfigError(f"{root / 'token'} is missing")
        context = ssl.create_default_context(cafile=str(root / "ca.crt"))
        namespace_file = root / "namespace"
        namespace = namespace_file.read_text().strip() if namespace_file.is_file() else "default"
        host = f"[{host}]" if ":" in host else host
        token = root / "token"
        return cls(f"https://{host}:{port}", context, token_file=token, namespace=namespace)

    @classmethod
    def from_file(cls, path: str | Path) -> KubeConfig:
        """The current context of a kubeconfig file: its cluster (server, CA, TLS
        verification) and user (token, client certificate)."""
        path = Path(path)
        doc = yaml.safe_load(path.read_text())
        if not isinstance(doc, dict):
            raise ConfigError(f"{path} is not a kubeconfig")
        current = doc.get("current-context")
        context = _named(doc, "contexts", current, "context")
        cluster = _named(doc, "clusters", context.get("cluster"), "cluster")
        user = _named(doc, "users", context.get("user"), "user") if context.get("user") else {}
        server = str(cluster.get("server") or "")
        if not server:
            raise ConfigError(f"{path}: cluster {context.get('cluster')} has no server")
        base = path.parent
        token = user.get("token")
        if token is None and user.get("tokenFile"):
            token = (base / str(user["tokenFile"])).read_text().strip()
        if user.get("auth-provider"):
            raise ConfigError(f"{path}: an auth-provider user is not supported (exec or a token)")
        return cls(
            server,
            _tls(cluster, user, base) if server.startswith("https") else None,
            token=token,
            namespace=str(context.get("namespace") or "default"),
            exec_plugin=user.get("exec"),
        )


def _exec_token(spec: Mapping[str, Any]) -> tuple[str, float | None]:
    """The token an exec credential plugin prints (an ExecCredential's status.token), and when
    it expires (epoch seconds; None: never). A client certificate from the plugin is not
    supported: ConfigError."""
    env = {**os.environ, **{e["name"]: e["value"] for e in spec.get("env") or []}}
    argv = [str(spec["command"]), *(str(a) for a in spec.get("args") or [])]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    if done.returncode != 0:
        raise ConfigError(f"credential plugin {argv[0]} failed: {done.stderr.strip()[:500]}")
    status = (json.loads(done.stdout).get("status") or {}) if done.stdout.strip() else {}
    token = status.get("token")
    if not token:
        raise ConfigError(f"credential plugin {argv[0]} gave no token")
    expiry = status.get("expirationTimestamp")
    when = (
        datetime.fromisoformat(str(expiry).replace("Z", "+00:00")).timestamp() - 10
        if expiry
        else None
    )
    return str(token), when


def _named(doc: Mapping[str, Any], section: str, name: Any, key: str) -> dict[str, Any]:
    for entry in doc.get(section) or []:
        if entry.get("name") == name:
            found: dict[str, Any] = entry.get(key) or {}
            return found
    if name is None and len(doc.get(section) or []) == 1:
        only: dict[str, Any] = doc[section][0].get(key) or {}
        return only
    raise ConfigError(f"no {key} named {name!r} in the kubeconfig's {section}")


def _pem(entry: Mapping[str, Any], key: str, base: Path) -> bytes | None:
    """`<key>-data` (base64) or `<key>` (a file, relative to the kubeconfig's directory)."""
    if entry.get(f"{key}-data"):
        return base64.b64decode(str(entry[f"{key}-data"]))
    if entry.get(key):
        return (base / str(entry[key])).read_bytes()
    return None


def _tls(cluster: Mapping[str, Any], user: Mapping[str, Any], base: Path) -> ssl.SSLContext:
    """One TLS context from the kubeconfig: the cluster's CA (or the system's), the user's
    client certificate and key (through a file ssl can load, removed at once)."""
    ca = _pem(cluster, "certificate-authority", base)
    context = ssl.create_default_context(cadata=ca.decode() if ca else None)
    if cluster.get("insecure-skip-tls-verify"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    cert, key = _pem(user, "client-certificate", base), _pem(user, "client-key", base)
    if cert is not None:
        with tempfile.TemporaryDirectory() as tmp:
            chain = Path(tmp) / "client.pem"
            chain.write_bytes(cert + b"\n" + (key or b""))
            chain.chmod(0o600)
            context.load_cert_chain(str(chain))
    return context


# ----------------------------------------------------------------------------- the session


def _status(code: int, text: str, headers: Mapping[str, str]) -> ApiStatus:
    """The failure an answer is: its Status's message, and the seconds to wait (Retry-After,
    or the Status's details.retryAfterSeconds)."""
    message, seconds = text[:500], None
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        body = json.loads(text)
        message = str(body.get("message") or message)
        seconds = (body.get("details") or {}).get("retryAfterSeconds")
    header = headers.get("Retry-After")
    if header is not None:
        with contextlib.suppress(ValueError):
            seconds = float(header)
    return ApiStatus(code, message, float(seconds) if seconds else None)


def _no_answer(exc: BaseException) -> ApiStatus:
    return ApiStatus(None, f"{type(exc).__name__}: {exc}")


class AsyncClient:
    """One aiohttp session to the apiserver (made on first use, inside the running loop), its
    calls on plain dicts; `field_manager` for creates and applies."""

    def __init__(
        self,
        config: KubeConfig,
        timeout: float = 10.0,
        field_manager: str = "cnidra",
        limit: int = LIMIT,
    ) -> None:
        self.config = config
        self.timeout = timeout
        self.field_manager = field_manager
        self.limit = limit
        self.namespace = config.namespace
        # aiohttp's request tracing, for whoever watches the wire (a benchmark's request log);
        # taken when the session is made, on first use
        self.trace_configs: list[aiohttp.TraceConfig] = []
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            context = self.config.ssl_context
            connector = aiohttp.TCPConnector(
                limit=self.limit + WATCHES,
                keepalive_timeout=KEEPALIVE,
                ssl=context if context is not None else False,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                json_serialize=json.dumps,
                trace_configs=self.trace_configs or None,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        if (auth := self.config.authorization()) is not None:
            headers["Authorization"] = auth
        return headers

    def _namespace(self, kind: Resource, namespace: str | None) -> str | None:
        if not kind.namespaced:
            return None
        return self.namespace if namespace is None else namespace

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str | None = None,
        seconds: float | None = None,
    ) -> Any:
        """One request, its answer's JSON; ApiStatus for a failure answer or none."""
        query = urlencode(params or {})
        data = None if body is None else json.dumps(body).encode()
        if data is not None and content_type is None:
            content_type = "application/json"
        limit = aiohttp.ClientTimeout(total=self.timeout if seconds is None else seconds)
        try:
            async with self._open().request(
                method,
                self.config.server + (f"{path}?{query}" if query else path),
                data=data,
                headers=self._headers(content_type),
                timeout=limit,
            ) as response:
                raw = await response.read()  # JSON is UTF-8: no charset guessed
                _count(method, path, query, content_type or "", response.status)
                if response.status >= 400:
                    raise _status(response.status, raw.decode("utf-8", "replace"), response.headers)
                return json.loads(raw) if raw else {}
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise _no_answer(exc) from exc

    # -- the verbs, on kinds

    async def get(self, kind: Resource, name: str, namespace: str | None = None) -> Any:
        return await self.request("GET", kind.path(self._namespace(kind, namespace), name))

    async def list(
        self,
        kind: Resource,
        *,
        namespace: str | None = None,
        labels: Mapping[str, Any] | None = None,
        fields: Mapping[str, Any] | None = None,
        chunk_size: int = 500,
    ) -> AsyncIterator[dict[str, Any]]:
        """Every object, page by page (`limit` and `continue`)."""
        params = {"limit": str(chunk_size)}
        if labels:
            params["labelSelector"] = selector(labels)
        if fields:
            params["fieldSelector"] = selector(fields)
        path = kind.path(self._namespace(kind, namespace))
        while True:
            page = await self.request("GET", path, params=params)
            for item in page.get("items") or []:
                # a list's items carry no apiVersion and kind: as a GET's answer does
                item.setdefault("apiVersion", kind.api_version)
                item.setdefault("kind", kind.kind)
                yield item
            more = (page.get("metadata") or {}).get("continue")
            if not more:
                return
            params["continue"] = str(more)

    async def create(
        self,
        kind: Resource,
        body: Mapping[str, Any],
        *,
        namespace: str | None = None,
        dry_run: bool = False,
        field_manager: str | None = None,
    ) -> Any:
        if namespace is None:
            namespace = (body.get("metadata") or {}).get("namespace")
        params = {"fieldManager": field_manager or self.field_manager}
        if dry_run:
            params["dryRun"] = "All"
        path = kind.path(self._namespace(kind, namespace))
        if kind.subresource:
            path += f"/{kind.subresource}"
        return await self.request("POST", path, params=params, body=kind.typed(body))

    async def delete(
        self,
        kind: Resource,
        name: str,
        namespace: str | None = None,
        grace_period: int | None = None,
    ) -> Any:
        params = {} if grace_period is None else {"gracePeriodSeconds": str(grace_period)}
        path = kind.path(self._namespace(kind, namespace), name)
        return await self.request("DELETE", path, params=params)

    async def patch(
        self,
        kind: Resource,
        name: str,
        body: Any,
        *,
        patch_type: str,
        namespace: str | None = None,
        field_manager: str | None = None,
        force: bool = False,
    ) -> Any:
        """`patch_type`: one of PATCH_TYPES' keys (apply, merge, json, strategic)."""
        params = {}
        if patch_type == "apply":
            params["fieldManager"] = field_manager or self.field_manager
            if force:
                params["force"] = "true"
            body = kind.typed(body)  # an apply names what it applies
        elif field_manager is not None:
            params["fieldManager"] = field_manager
        return await self.request(
            "PATCH",
            kind.path(self._namespace(kind, namespace), name),
            params=params,
            body=body,
            content_type=PATCH_TYPES[patch_type],
        )

    async def watch(
        self,
        kind: Resource,
        *,
        namespace: str | None = None,
        fields: Mapping[str, Any] | None = None,
        labels: Mapping[str, Any] | None = None,
        seconds: int | None = None,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(event type, object) as the apiserver streams them, for ever: a watch the apiserver
        ends (after `seconds`, or WATCH_SECONDS to twice that) is watched again from the last
        resourceVersion seen (bookmarks keep it current and are not yielded). Raises ApiStatus
        when it is refused (410: the version is too old; the caller lists again) or the
        connection fails."""
        params = {"watch": "true", "allowWatchBookmarks": "true"}
        if fields:
            params["fieldSelector"] = selector(fields)
        if labels:
            params["labelSelector"] = selector(labels)
        path = kind.path(self._namespace(kind, namespace))
        while True:
            timeout = seconds or WATCH_SECONDS + random.randrange(WATCH_SECONDS)
            params["timeoutSeconds"] = str(timeout)
            started, events = time.monotonic(), 0
            async for event, obj in self._watch_once(path, params, timeout):
                events += 1
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if version:
                    params["resourceVersion"] = str(version)
                if event != "BOOKMARK":
                    yield event, obj
            if not events and time.monotonic() - started < EMPTY_WATCH:
                # ended at once with nothing (a proxy closing it?): the caller's backoff, not
                # a loop of watches
                raise ApiStatus(None, "the watch ended at once, empty")

    async def _watch_once(
        self, path: str, params: Mapping[str, str], seconds: int
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        query = urlencode(params)
        # the apiserver ends the watch after `seconds`; a connection silent past that is dead
        limit = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout, sock_read=seconds + 30)
        headers = self._headers(None)
        # a watch's events uncompressed (aiohttp asks for gzip by default, and the apiserver
        # compresses each watcher's stream: every event deflated there and inflated here, the
        # driver's pod watch in a 50-pod burst 2.6-4.4 % of its CPU on the test bed for about
        # a third of the bytes); GETs and LISTs keep gzip, which the apiserver uses only above
        # 128 KiB, where the bytes matter
        headers["Accept-Encoding"] = "identity"
        try:
            async with self._open().get(
                f"{self.config.server}{path}?{query}", headers=headers, timeout=limit
            ) as response:
                _count("GET", path, query, "", response.status)
                if response.status >= 400:
                    raise _status(response.status, await response.text(), response.headers)
                async for line in response.content:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    kind, obj = str(event.get("type")), event.get("object") or {}
                    if kind == "ERROR":
                        raise ApiStatus(
                            int(obj.get("code") or 500), str(obj.get("message") or "watch error")
                        )
                    yield kind, obj
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise _no_answer(exc) from exc


PATCH_TYPES = {
    "apply": "application/apply-patch+yaml",
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
}


def _count(method: str, path: str, query: str, content_type: str, code: int) -> None:
    """One answered request in cnidra_apiserver_requests_total."""
    verb, resource = metrics.request_kind(method, path, query, content_type)
    metrics.APISERVER_REQUESTS.labels(verb, resource, str(code)).inc()


# ----------------------------------------------------------------------------- synchronous


class Client:
    """The admission webhook's client, for its worker threads: the standard library's
    http.client over the same TLS context, a connection per thread kept open between
    requests; GET only (what the webhook reads)."""

    def __init__(self, config: KubeConfig, timeout: float = 5.0) -> None:
        self.config = config
        self.timeout = timeout
        self.namespace = config.namespace
        self._local = threading.local()

    def _connection(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            url = urlsplit(self.config.server)
            host, port = url.hostname or "localhost", url.port
            if url.scheme == "https":
                conn = http.client.HTTPSConnection(
                    host, port, timeout=self.timeout, context=self.config.ssl_context
                )
            else:
                conn = http.client.HTTPConnection(host, port, timeout=self.timeout)
            self._local.conn = conn
        return conn

    @contextlib.contextmanager
    def _fresh_on_failure(self) -> Iterator[Any]:
        conn = self._connection()
        try:
            yield conn
        except BaseException:
            conn.close()
            self._local.conn = None
            raise

    def get(self, kind: Resource, name: str, namespace: str | None = None) -> Any:
        ns = (self.namespace if namespace is None else namespace) if kind.namespaced else None
        path = urlsplit(self.config.server).path.rstrip("/") + kind.path(ns, name)
        headers = {"Accept": "application/json"}
        if (auth := self.config.authorization()) is not None:
            headers["Authorization"] = auth
        try:
            with self._fresh_on_failure() as conn:
                conn.request("GET", path, headers=headers)
                response = conn.getresponse()
                text = response.read().decode("utf-8", "replace")
        except (OSError, TimeoutError, http.client.HTTPException) as exc:
            raise _no_answer(exc) from exc
        _count("GET", path, "", "", response.status)
        if response.status >= 400:
            raise _status(response.status, text, response.headers)
        return json.loads(text)

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
