"""An apiserver that answers at once, for benchmarks of the driver's own cost (not a test).

HTTP/2 over TLS on 127.0.0.1, as the driver's client speaks to a real apiserver (one connection,
ALPN h2), so the client's framing, TLS and JSON decoding stay in what is measured; only the
apiserver's own work is gone. It serves the objects it is given, each by its API path, with a
GET. A path given a list (an object whose kind ends in "List", such as {"kind":
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

import h2.config
import h2.connection
import h2.events
import h2.exceptions


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


class Connection(asyncio.Protocol):
    """One client connection: each request answered when its stream ends, with flow control."""

    def __init__(self, store: Store, counts: dict[str, int]) -> None:
        self.store = store
        self.counts = counts
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        )
        self.requests: dict[int, dict[str, str]] = {}
        self.bodies: dict[int, bytearray] = {}
        self.pending: dict[int, bytes] = {}
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.h2.initiate_connection()
        self.flush()

    def flush(self) -> None:
        if self.transport is not None:
            self.transport.write(self.h2.data_to_send())

    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError:
            self.flush()
            if self.transport is not None:
                self.transport.close()
            return
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                self.requests[event.stream_id] = {str(k): str(v) for k, v in event.headers}
            elif isinstance(event, h2.events.DataReceived):
                self.bodies.setdefault(event.stream_id, bytearray()).extend(event.data or b"")
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                self.respond(event.stream_id)
            elif isinstance(event, h2.events.WindowUpdated):
                self.send_pending()
            elif isinstance(event, h2.events.StreamReset):
                self.pending.pop(event.stream_id, None)
            elif isinstance(event, h2.events.ConnectionTerminated) and self.transport:
                self.transport.close()
        self.flush()

    def respond(self, stream: int) -> None:
        headers = self.requests.pop(stream, {})
        method = headers.get(":method", "")
        code, body = self.store.answer(
            method, headers.get(":path", ""), bytes(self.bodies.pop(stream, b""))
        )
        self.counts[method] = self.counts.get(method, 0) + 1
        self.h2.send_headers(
            stream,
            [
                (":status", str(code)),
                ("content-type", "application/json"),
                ("content-length", str(len(body))),
            ],
        )
        self.pending[stream] = body
        self.send_pending()

    def send_pending(self) -> None:
        for stream in list(self.pending):
            data = self.pending[stream]
            try:
                while data:
                    window = min(
                        self.h2.local_flow_control_window(stream), self.h2.max_outbound_frame_size
                    )
                    if window <= 0:
                        break
                    self.h2.send_data(stream, data[:window])
                    data = data[window:]
                if data:
                    self.pending[stream] = data
                    continue
                self.h2.end_stream(stream)
            except h2.exceptions.StreamClosedError:
                pass
            del self.pending[stream]


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
    context.set_alpn_protocols(["h2"])
    counts: dict[str, int] = {}
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: Connection(store, counts), "127.0.0.1", 0, ssl=context
    )
    port = server.sockets[0].getsockname()[1]
    print(port, flush=True)
    # ends when the parent closes our stdin
    await loop.run_in_executor(None, sys.stdin.read)
    server.close()
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
