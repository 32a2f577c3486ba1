"""An apiserver that answers at once, for benchmarks of the driver's own cost (not a test).

HTTP/2 over TLS on 127.0.0.1, as the driver's client speaks to a real apiserver (one connection,
ALPN h2), so the client's framing, TLS and JSON decoding stay in what is measured; only the
apiserver's own work is gone. It serves the objects it is given, each by its API path, with a
GET; anything else is a 404 Status. Run as its own process, as an apiserver is:

    python -m bench.fake_apiserver --objects FILE --cert CERT --key KEY

FILE is a JSON object mapping API paths to objects. The first line on stdout is the port.
Imports nothing of cnidra's, so it stays small and starts fast.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions

NOT_FOUND = json.dumps(
    {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}
).encode()


class Connection(asyncio.Protocol):
    """One client connection: each request answered when its stream ends, with flow control."""

    def __init__(self, objects: dict[str, bytes], counts: dict[str, int]) -> None:
        self.objects = objects
        self.counts = counts
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        )
        self.requests: dict[int, dict[str, str]] = {}
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
        path = headers.get(":path", "").split("?", 1)[0]
        body = self.objects.get(path) if method == "GET" else None
        self.counts[method] = self.counts.get(method, 0) + 1
        status = 200 if body is not None else 404
        body = body if body is not None else NOT_FOUND
        self.h2.send_headers(
            stream,
            [
                (":status", str(status)),
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


async def serve(objects: dict[str, bytes], cert: Path, key: Path) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    context.set_alpn_protocols(["h2"])
    counts: dict[str, int] = {}
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: Connection(objects, counts), "127.0.0.1", 0, ssl=context
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
    raw = json.loads(args.objects.read_bytes())
    objects = {path: json.dumps(obj).encode() for path, obj in raw.items()}
    asyncio.run(serve(objects, args.cert, args.key))


if __name__ == "__main__":
    main()
