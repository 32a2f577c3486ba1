"""The admission webhook's throughput and latency, with and without 200 idle connections held
open (half before the TLS handshake, half with a request begun and never finished).

    python -m bench.webhook [--reviews 400] [--clients 4] [--idle 200] [--json]

The server is `cnidra webhook`'s (uvicorn, the same review pool), on loopback, with the
shipped DeviceClasses; each client keeps one HTTPS connection alive and sends AdmissionReviews
of an ordinary claim back to back. Not a test: it prints figures."""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import ssl
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from cnidra.admission.webhook import WebhookServer
from tests.admission.test_webhook import admission, self_signed
from tests.api.test_policy import DEFAULT_CLASSES, MACVLAN, claim, network

CLASSES = {c["metadata"]["name"]: c for c in DEFAULT_CLASSES}


def hold(port: int, count: int, context: ssl.SSLContext) -> list[socket.socket]:
    held: list[socket.socket] = []
    for i in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        if i % 2:
            tls = context.wrap_socket(sock, server_hostname="127.0.0.1")
            tls.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 9999\r\n\r\n{")
            sock = tls
        held.append(sock)
    return held


def run(port: int, context: ssl.SSLContext, reviews: int, clients: int) -> dict[str, Any]:
    body = json.dumps(admission(claim(network(MACVLAN)))).encode()
    latencies: list[float] = []
    lock = threading.Lock()

    def client(count: int) -> None:
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
        mine = []
        for _ in range(count):
            start = time.perf_counter()
            conn.request("POST", "/validate", body, {"Content-Type": "application/json"})
            answer = json.loads(conn.getresponse().read())
            assert answer["response"]["allowed"] is True
            mine.append(time.perf_counter() - start)
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(reviews // clients,)) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    latencies.sort()
    return {
        "reviews": len(latencies),
        "reviews_per_s": round(len(latencies) / wall, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 2),
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reviews", type=int, default=400)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--idle", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = self_signed(Path(tmp))
        server = WebhookServer("127.0.0.1:0", str(cert), str(key), CLASSES.get, lambda ns: {})
        server.start()
        context = ssl.create_default_context(cafile=str(cert))
        try:
            run(server.port, context, 40, 2)  # warm up
            quiet = run(server.port, context, args.reviews, args.clients)
            held = hold(server.port, args.idle, context)
            try:
                busy = run(server.port, context, args.reviews, args.clients)
            finally:
                for sock in held:
                    sock.close()
        finally:
            server.shutdown()
    out = {"no_idle": quiet, f"idle_{args.idle}": busy}
    if args.json:
        print(json.dumps(out))
    else:
        for name, figures in out.items():
            print(f"{name:>10}: " + ", ".join(f"{k} {v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
