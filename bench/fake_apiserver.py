"""An apiserver that answers at once, for benchmarks of the driver's own cost (not a test).

HTTP/1.1 keep-alive over TLS on 127.0.0.1 (aiohttp's server), as the driver's client speaks to a
real apiserver (ALPN http/1.1), so the client's framing, TLS and JSON decoding stay in what is
measured; only the apiserver's own work is gone. It serves the objects it is given, each by its
API path, with a GET. A path given a list (an object whose kind ends in "List", such as {"kind":
"CNIIPBlockList", "apiVersion": ..., "items": []}) is a collection: a GET lists its items and
the objects created in it (those whose labels match a `labelSelector` of `k=v` terms), a POST
creates one (with a uid; 409 AlreadyExists when its name is taken), which a GET of its path
then serves. Anything else is a 404 Status. Run as its own process, as an apiserver is:

    python -m bench.fake_apiserver --objects FILE --cert CERT --key KEY

FILE is a JSON object mapping API paths to objects. The first line on stdout is the port; when
stdin closes, the last is the count of requests by method. Imports nothing of cnidra's, so it
stays small and starts fast.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import subprocess
import sys
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web


def status(reason: str, code: int) -> bytes:
    return json.dumps(
        {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code}
    ).encode()


NOT_FOUND = status("NotFound", 404)


class Store:
    """The objects served, by path; collections (lists) and what was created in them."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.objects: dict[str, bytes] = {}
        self.collections: dict[str, dict[str, Any]] = {}
        self.created: dict[str, list[dict[str, Any]]] = {}
        for path, obj in raw.items():
            if str(obj.get("kind", "")).endswith("List"):
                self.collections[path] = obj
                self.created[path] = []
            else:
                self.objects[path] = json.dumps(obj).encode()

    def answer(self, method: str, target: str, body: bytes) -> tuple[int, bytes]:
        path, _, query = target.partition("?")
        if method == "GET" and path in self.objects:
            return 200, self.objects[path]
        if method == "GET" and path in self.collections:
            return 200, self._list(path, urllib.parse.parse_qs(query).get("labelSelector", [""]))
        if method == "POST" and path in self.collections:
            return self._create(path, json.loads(body or b"{}"))
        return 404, NOT_FOUND

    def _list(self, path: str, selectors: list[str]) -> bytes:
        wanted = dict(t.split("=", 1) for s in selectors for t in s.split(",") if "=" in t)
        listed = dict(self.collections[path])
        items = [*listed.get("items", []), *self.created[path]]
        listed["items"] = [o for o in items if _labelled(o, wanted)]
        listed["metadata"] = {"resourceVersion": str(len(self.created[path]) + 1)}
        return json.dumps(listed).encode()

    def _create(self, path: str, obj: dict[str, Any]) -> tuple[int, bytes]:
        meta = obj.setdefault("metadata", {})
        where = f"{path}/{meta.get('name', '')}"
        if where in self.objects:
            return 409, status("AlreadyExists", 409)
        meta.update(uid=str(uuid.uuid4()), resourceVersion=str(len(self.objects) + 1))
        meta.setdefault("creationTimestamp", "2026-05-04T10:20:30Z")
        self.created[path].append(obj)
        self.objects[where] = json.dumps(obj).encode()
        return 201, self.objects[where]


def _labelled(obj: dict[str, Any], wanted: dict[str, str]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in wanted.items())


def certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (also the client's CA), and its key."""
    cert, key = directory / "apiserver.crt", directory / "apiserver.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1",
         "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,digitalSignature,keyCertSign",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def kubeconfig(port: int, cert: Path) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "fake",
                "cluster": {
                    "server": f"https://127.0.0.1:{port}",
                    "certificate-authority": str(cert),
                },
            }
        ],
        "users": [{"name": "driver", "user": {"token": "bench"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "driver"}}],
        "current-context": "fake",
    }


async def serve(store: Store, cert: Path, key: Path) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    context.set_alpn_protocols(["http/1.1"])
    counts: dict[str, int] = {}

    async def answer(request: web.Request) -> web.Response:
        code, body = store.answer(request.method, request.path_qs, await request.read())
        counts[request.method] = counts.get(request.method, 0) + 1
        return web.Response(status=code, body=body, content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    print(port, flush=True)
    # ends when the parent closes our stdin
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await runner.cleanup()
    print(json.dumps(counts), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=Path, required=True)
    parser.add_argument("--cert", type=Path, required=True)
    parser.add_argument("--key", type=Path, required=True)
    args = parser.parse_args()
    asyncio.run(serve(Store(json.loads(args.objects.read_bytes())), args.cert, args.key))


if __name__ == "__main__":
    main()
