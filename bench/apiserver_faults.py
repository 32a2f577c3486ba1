"""The driver behind a slow and throttling apiserver (not a test: numbers, and the checks that
must hold; `make apiserver-faults`).

    python -m bench.apiserver_faults [--pods 10] [--json]

A fault-injecting reverse proxy on loopback stands between the driver (run with the shipped
defaults on the test bed) and the apiserver: it terminates the driver's TLS with its own
certificate, forwards each request with the driver's own client certificate, counts every
request, and on demand adds latency, answers 429 with Retry-After (API Priority and
Fairness), answers 500, or cuts watch streams. Phases:

1. at rest (60 s): the driver's requests per second with nothing to do;
2. healthy: --pods pods with a cnidra interface created and deleted; requests per pod;
3. throttled (50 % of requests 429 with Retry-After 2 s, 10 % 500, 200 ms added to the rest,
   watches cut after 5 s) while as many pods are created: the request rate (overall and its
   busiest second: no retry storm), whether each prepare answered kubelet within its
   deadline or failed cleanly (pods Ready in the end);
4. healed: time until every claim's status and finalizers converge after the pods go.

The last line is one JSON object. Exits 1 when a check fails (a pod not Ready after the
faults, a status not converged, a busiest second above 20 requests).

The pods' network takes its address from cnidra's cluster IPAM at prepare (a CNIIPPool of
198.18.220.0/24 made for the run; host-local written by a claim is refused, bench/pools.py),
so prepare's IPAM requests go through the proxy too: the pool's GET (kept 10 s), and a block
LIST and CREATE (the Node's GET once) when the node takes a block, 16 addresses at a time.
They count in requests per pod, and under the faults cnidra/kube/ipam.py retries them. Before,
the claims wrote host-local, which asks the apiserver nothing: requests per pod are not
comparable with runs of then.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import random
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx2
import uvicorn
import yaml

from bench.pools import cnidra_ipam, delete_pool, in_namespace, pool_name, pool_object
from cnidra.state.layout import DEFAULT_STATE_ROOT
from testbed import cluster as tb
from testbed.harness import Cluster, DriverProcess, free_port

DRIVER = "cni.dra.networking.x-k8s.io"
SUBNET = "198.18.220.0/24"
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "content-length"}


class Faults:
    latency = 0.0
    p429 = 0.0
    retry_after = 2
    p500 = 0.0
    cut_watch_after: float | None = None


class FaultProxy:
    """An ASGI app forwarding to the apiserver, counting and faulting on demand."""

    def __init__(self, upstream: str, ca: str, cert: str, key: str) -> None:
        self.upstream = upstream
        self.ca, self.cert, self.key = ca, cert, key
        self.faults = Faults()
        self.log: list[tuple[float, str, str, int]] = []  # time, method, kind, status
        self.client: httpx2.AsyncClient | None = None

    def count(self, since: float, until: float | None = None) -> list[tuple[float, str, str, int]]:
        until = until or time.monotonic()
        return [e for e in self.log if since <= e[0] < until]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if self.client is None:
            context = ssl.create_default_context(cafile=self.ca)
            context.load_cert_chain(self.cert, self.key)
            self.client = httpx2.AsyncClient(base_url=self.upstream, verify=context, timeout=None)
        path = scope["path"] + (
            ("?" + scope["query_string"].decode()) if scope["query_string"] else ""
        )
        kind = _kind(scope["method"], scope["path"], scope["query_string"].decode())
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        f = self.faults
        if f.latency:
            await asyncio.sleep(f.latency)
        roll = random.random()
        if roll < f.p429:
            self.log.append((time.monotonic(), scope["method"], kind, 429))
            status = {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "code": 429,
                "reason": "TooManyRequests",
                "message": "too many requests",
                "details": {"retryAfterSeconds": f.retry_after},
            }
            await _answer(send, 429, status, [(b"retry-after", str(f.retry_after).encode())])
            return
        if roll < f.p429 + f.p500:
            self.log.append((time.monotonic(), scope["method"], kind, 500))
            status = {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "code": 500,
                "reason": "InternalError",
                "message": "storage is (re)initializing",
            }
            await _answer(send, 500, status)
            return
        headers = [
            (k.decode(), v.decode())
            for k, v in scope["headers"]
            if k.decode().lower() not in HOP_BY_HOP | {"host"}
        ]
        request = self.client.build_request(scope["method"], path, headers=headers, content=body)
        response = await self.client.send(request, stream=True)
        self.log.append((time.monotonic(), scope["method"], kind, response.status_code))
        out = [
            (k.encode(), v.encode())
            for k, v in response.headers.items()
            if k.lower() not in HOP_BY_HOP
        ]
        await send({"type": "http.response.start", "status": response.status_code, "headers": out})
        started = time.monotonic()
        try:
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                cut = f.cut_watch_after
                if (
                    kind.startswith("WATCH")
                    and cut is not None
                    and time.monotonic() - started > cut
                ):
                    break
        except httpx2.TransportError:
            pass  # the apiserver went away mid-stream (the bench's teardown): end it as cut
        finally:
            await response.aclose()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _kind(method: str, path: str, query: str) -> str:
    """The verb and the resource of a request: "GET resourceclaims", "WATCH cninetworks"."""
    parts = path.strip("/").split("/")
    if "namespaces" in parts and parts.index("namespaces") + 2 < len(parts):
        resource = parts[parts.index("namespaces") + 2]
    elif parts[0] == "apis" and len(parts) > 3:
        resource = parts[3]
    elif parts[0] == "api" and len(parts) > 2:
        resource = parts[2]
    else:
        resource = path
    if "watch=true" in query or "watch=1" in query:
        return f"WATCH {resource}"
    return f"{method} {resource}"


async def _answer(
    send: Any, code: int, body: dict[str, Any], extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": code, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": data})


def serve(app: FaultProxy, port: int, cert: str, key: str) -> uvicorn.Server:
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        ssl_certfile=cert,
        ssl_keyfile=key,
        log_config=None,
        access_log=False,
        lifespan="off",
        http="h11",
    )
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 15
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    return server


def proxied_kubeconfig(work: Path, port: int) -> tuple[Path, FaultProxy]:
    """A kubeconfig naming the proxy (its own CA), and the proxy using the admin's identity."""
    admin = yaml.safe_load(tb.Paths.admin_kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    user = admin["users"][0]["user"]

    def materialize(entry: dict[str, Any], key: str, name: str) -> str:
        if f"{key}-data" in entry:
            path = work / name
            path.write_bytes(base64.b64decode(entry[f"{key}-data"]))
            return str(path)
        return str(entry[key])

    ca = materialize(cluster, "certificate-authority", "upstream-ca.crt")
    cert = materialize(user, "client-certificate", "client.crt")
    key = materialize(user, "client-key", "client.key")
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(work / "proxy.key"),
            "-out",
            str(work / "proxy.crt"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    proxy = FaultProxy(cluster["server"], ca, cert, key)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "proxy",
                "cluster": {
                    "server": f"https://127.0.0.1:{port}",
                    "certificate-authority-data": base64.b64encode(
                        (work / "proxy.crt").read_bytes()
                    ).decode(),
                },
            }
        ],
        "users": [{"name": "driver", "user": {"client-certificate": cert, "client-key": key}}],
        "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "driver"}}],
        "current-context": "proxy",
    }
    path = work / "proxied.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path, proxy


def template(parent: str, pool: str) -> dict[str, Any]:
    config = {
        "cniVersion": "1.0.0",
        "name": "faults",
        "plugins": [{"type": "macvlan", "mode": "bridge", "ipam": cnidra_ipam(pool)}],
    }
    selector = f'device.attributes["{DRIVER}"].ifName == "{parent}"'
    params = {
        "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
        "kind": "CNIConfig",
        "config": config,
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "net"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "net",
                            "exactly": {
                                "deviceClassName": "cni.networking.x-k8s.io",
                                "selectors": [{"cel": {"expression": selector}}],
                            },
                        }
                    ],
                    "config": [
                        {"requests": ["net"], "opaque": {"driver": DRIVER, "parameters": params}}
                    ],
                }
            }
        },
    }


def policy_samples() -> list[dict[str, Any]]:
    """What the run sends, for tests/bench's check against the shipped policy."""
    return [
        pool_object("bench-faults", SUBNET, ["faults-ns"]),
        *in_namespace("faults-ns", template("af0", "bench-faults"), pod("h0")),
    ]


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"faults": "1"}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "net", "resourceClaimTemplateName": "net"}],
            "containers": [
                {
                    "name": "c",
                    "image": tb.TEST_IMAGE,
                    "command": ["sleep", "3600"],
                    "resources": {"claims": [{"name": "net"}]},
                }
            ],
        },
    }


def ready_count(bed: Cluster, namespace: str) -> int:
    items = json.loads(bed.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
    return sum(
        any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p.get("status", {}).get("conditions", [])
        )
        for p in items
    )


def claims_converged(bed: Cluster, namespace: str) -> bool:
    """Every claim of a running pod has its device status; no claim of a gone pod is left."""
    claims = json.loads(bed.kubectl("get", "resourceclaims", "-n", namespace, "-o", "json").stdout)
    return all(c.get("status", {}).get("devices") for c in claims["items"])


def busiest_second(events: list[tuple[float, str, str, int]]) -> int:
    per = Counter(int(t) for t, *_ in events)
    return max(per.values(), default=0)


def main() -> None:  # noqa: PLR0915 - one linear script of measurements
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=10)
    parser.add_argument("--rest-seconds", type=float, default=60)
    parser.add_argument("--json", action="store_true", help="only the JSON line")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    say = (lambda *a: None) if args.json else print
    parent = f"af{uuid.uuid4().hex[:4]}"
    namespace = f"faults-{uuid.uuid4().hex[:6]}"
    pool = pool_name("apiserver_faults")
    failures: list[str] = []
    with tb.session() as bins, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        bed = Cluster(bins, tb.env_dict())
        bed.install_cnidra_api()
        subprocess.run(["ip", "link", "add", parent, "type", "bridge"], check=True)
        subprocess.run(["ip", "link", "set", parent, "up"], check=True)
        port = free_port()
        kubeconfig, proxy = proxied_kubeconfig(work, port)
        server = serve(proxy, port, str(work / "proxy.crt"), str(work / "proxy.key"))
        (work / "driver").mkdir()
        driver = DriverProcess(
            bed, work / "driver", defaults=True, extra_env={"CNIDRA_KUBECONFIG": str(kubeconfig)}
        )
        try:
            driver.start()
            bed.wait("NRI", lambda: driver.health().get("nriConnected"), 60)
            bed.kubectl("create", "namespace", namespace)
            bed.kubectl(
                "label", "namespace", namespace, "cni.networking.x-k8s.io/claim-config=true"
            )
            bed.wait(
                "the ServiceAccount",
                lambda: (
                    bed.kubectl(
                        "get", "serviceaccount", "default", "-n", namespace, check=False
                    ).returncode
                    == 0
                ),
                60,
            )
            bed.apply(pool_object(pool, SUBNET, [namespace]))
            bed.apply_in(namespace, template(parent, pool))
            time.sleep(10)  # start-up requests done
            # 1. at rest
            t0 = time.monotonic()
            time.sleep(args.rest_seconds)
            rest = proxy.count(t0)
            rest_rps = len(rest) / args.rest_seconds
            say(f"at rest: {rest_rps:.3f} requests/s: {Counter(k for _, _, k, _ in rest)}")
            # 2. healthy pods
            t1 = time.monotonic()
            names = [f"h{i}" for i in range(args.pods)]
            bed.apply_in(namespace, *(pod(n) for n in names))
            bed.wait("the pods Ready", lambda: ready_count(bed, namespace) == len(names), 300)
            bed.kubectl(
                "delete",
                "pods",
                "-n",
                namespace,
                "--all",
                "--wait=true",
                "--timeout=180s",
                timeout=240,
            )
            bed.wait(
                "the claims gone",
                lambda: (
                    not json.loads(
                        bed.kubectl("get", "resourceclaims", "-n", namespace, "-o", "json").stdout
                    )["items"]
                ),
                120,
            )
            time.sleep(5)
            healthy = proxy.count(t1)
            per_pod = (len(healthy) - rest_rps * (time.monotonic() - t1)) / len(names)
            say(f"healthy: {per_pod:.1f} requests per pod: {Counter(k for _, _, k, _ in healthy)}")
            # 3. throttled
            f = proxy.faults
            f.latency, f.p429, f.p500, f.cut_watch_after = 0.2, 0.5, 0.1, 5.0
            t2 = time.monotonic()
            names = [f"t{i}" for i in range(args.pods)]
            bed.apply_in(namespace, *(pod(n) for n in names))
            time.sleep(60)
            throttled = proxy.count(t2)
            throttled_rps = len(throttled) / (time.monotonic() - t2)
            storm = busiest_second(throttled)
            say(
                f"throttled: {throttled_rps:.2f} requests/s, busiest second {storm}: "
                f"{Counter((k, s) for _, _, k, s in throttled)}"
            )
            ready_under_faults = ready_count(bed, namespace)
            # 4. healed
            f.latency, f.p429, f.p500, f.cut_watch_after = 0.0, 0.0, 0.0, None
            t3 = time.monotonic()
            try:
                bed.wait(
                    "the pods Ready once healthy",
                    lambda: ready_count(bed, namespace) == len(names),
                    300,
                )
                bed.wait("every claim's status", lambda: claims_converged(bed, namespace), 120)
            except TimeoutError as exc:
                failures.append(str(exc))
            converged = time.monotonic() - t3
            bed.kubectl(
                "delete",
                "pods",
                "-n",
                namespace,
                "--all",
                "--wait=true",
                "--timeout=180s",
                timeout=240,
            )
            try:
                bed.wait(
                    "finalizers released and claims gone",
                    lambda: (
                        not json.loads(
                            bed.kubectl(
                                "get", "resourceclaims", "-n", namespace, "-o", "json"
                            ).stdout
                        )["items"]
                    ),
                    120,
                )
            except TimeoutError as exc:
                failures.append(str(exc))
            if storm > 20:
                failures.append(f"a retry storm: {storm} requests in one second while throttled")
            result = {
                "rest_requests_per_s": round(rest_rps, 3),
                "requests_per_pod": round(per_pod, 1),
                "throttled": {
                    "requests_per_s": round(throttled_rps, 2),
                    "busiest_second": storm,
                    "answers": dict(Counter(str(s) for *_, s in throttled)),
                    "pods_ready_under_faults": ready_under_faults,
                    "pods": len(names),
                },
                "converged_s": round(converged, 1),
                "failures": failures,
            }
            print(json.dumps(result))
        finally:
            with contextlib.suppress(Exception):
                bed.kubectl(
                    "delete",
                    "namespace",
                    namespace,
                    "--wait=true",
                    "--timeout=120s",
                    check=False,
                    timeout=180,
                )
            delete_pool(bed, pool)
            driver.stop()
            server.should_exit = True
            shutil.rmtree(DEFAULT_STATE_ROOT, ignore_errors=True)
            subprocess.run(["ip", "link", "del", parent], check=False, capture_output=True)
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()
