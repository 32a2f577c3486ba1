"""Traffic between two namespaces of a test's own, for the shaping tests and bench/shaping.py: a
veth pair with 198.18.0.0/15 addresses, a TCP sender and receiver that stop by themselves, and
a request/response round trip. Sockets are made inside a namespace (cnidra.util.netns, from the
calling thread only) and used from anywhere: a socket stays in the namespace it was made in."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cnidra.cni import netns
from cnidra.util.netns import entered

POD_IP = "198.18.44.1"
PEER_IP = "198.18.44.2"
POD_IF = "shp0"
PEER_IF = "shp1"
PORT = 5201
CHUNK = 64 * 1024
# The share of a shaped rate a TCP receiver sees as payload: the shaper counts each full-size
# frame's 1514 bytes (Ethernet 14, IP 20, TCP 32 with timestamps), the receiver its 1448. A
# limit judged on the payload rate is judged against this share of it (measured: 287 of 300,
# 191 of 200 Mbit/s), else the window below it is half the window above it.
PAYLOAD_SHARE = 1448 / 1514


@dataclass(frozen=True)
class Pair:
    """A "pod" namespace and a peer joined by a veth pair (POD_IF in the pod, PEER_IF in the
    peer)."""

    pod: Path
    peer: Path


def ip(ns: Path, *args: str) -> None:
    subprocess.run(["ip", "-n", ns.name, *args], check=True, capture_output=True, timeout=10)


@contextlib.contextmanager
def veth_pair() -> Iterator[Pair]:
    """Two namespaces of this run (their names carry its tag), removed whatever happens."""
    with netns.temporary("cnidra-shp-pod") as pod, netns.temporary("cnidra-shp-peer") as peer:
        ip(pod, "link", "add", POD_IF, "type", "veth", "peer", "name", PEER_IF, "netns", peer.name)
        ip(pod, "addr", "add", f"{POD_IP}/30", "dev", POD_IF)
        ip(peer, "addr", "add", f"{PEER_IP}/30", "dev", PEER_IF)
        ip(pod, "link", "set", POD_IF, "up")
        ip(peer, "link", "set", PEER_IF, "up")
        # both ends with carrier before the test looks: a veth's carrier comes a moment after
        # `up`, and a test comparing the links before and after saw it change in between
        wait_for_carrier((pod, POD_IF), (peer, PEER_IF))
        yield Pair(pod, peer)


def wait_for_carrier(*ends: tuple[Path, str], within: float = 10.0) -> None:
    """Until each (namespace, link) has carrier (LOWER_UP): a veth drops what is sent, and
    shows NO-CARRIER, until both its ends are up. TimeoutError past `within` seconds."""
    deadline = time.monotonic() + within
    while not all(_carrier(ns, name) for ns, name in ends):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no carrier on {ends} within {within:g} s")
        time.sleep(0.01)


def _carrier(ns: Path, name: str) -> bool:
    shown = subprocess.run(
        ["ip", "-n", ns.name, "-o", "link", "show", name],
        check=True, capture_output=True, text=True, timeout=10,
    )  # fmt: skip
    flags = shown.stdout.split("<", 1)[-1].split(">", 1)[0].split(",")
    return "LOWER_UP" in flags and "NO-CARRIER" not in flags


@dataclass(frozen=True)
class Transfer:
    """What a receiver got: the payload rate over the steady part (after `skip` seconds, the
    slow start and the shaper's first burst left out), and the rate over each 100 ms."""

    mbps: float
    total_bytes: int
    buckets_mbps: tuple[float, ...]


def _socket_in(ns: Path) -> socket.socket:
    with entered(ns):
        return socket.socket(socket.AF_INET, socket.SOCK_STREAM)


def send(
    src: Path, dst: Path, dst_ip: str, seconds: float, skip: float = 0.5, port: int = PORT
) -> Transfer:
    """TCP from `src` to `dst_ip` in `dst` for `seconds`; the payload rate the receiver saw.
    Bounded: the sender stops at the deadline, the receiver at the end of the stream or 5 s
    after its last byte."""
    listener = _socket_in(dst)
    client = _socket_in(src)
    with listener, client:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((dst_ip, port))
        listener.listen(1)
        listener.settimeout(5)
        client.settimeout(5)
        client.connect((dst_ip, port))
        conn, _ = listener.accept()
        marks: list[tuple[float, int]] = []

        def receive() -> None:
            total = 0
            conn.settimeout(5)
            with conn:
                while True:
                    try:
                        data = conn.recv(CHUNK)
                    except OSError:
                        return
                    if not data:
                        return
                    total += len(data)
                    marks.append((time.monotonic(), total))

        receiver = threading.Thread(target=receive, name="receiver", daemon=True)
        receiver.start()
        payload = b"\0" * CHUNK
        start = time.monotonic()
        deadline = start + seconds
        client.settimeout(0.2)
        while time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                client.send(payload)
        client.shutdown(socket.SHUT_WR)
        receiver.join(10)
    return _transfer(marks, start, skip, seconds)


def _transfer(
    marks: list[tuple[float, int]], start: float, skip: float, seconds: float
) -> Transfer:
    def at(t: float) -> tuple[float, int]:
        before = [m for m in marks if m[0] <= start + t]
        return before[-1] if before else (start, 0)

    first, last = at(skip), at(seconds)
    span = last[0] - first[0]
    mbps = (last[1] - first[1]) * 8 / span / 1e6 if span > 0 else 0.0
    buckets = []
    for i in range(int(seconds / 0.1)):
        a, b = at(i * 0.1), at((i + 1) * 0.1)
        buckets.append((b[1] - a[1]) * 8 / 0.1 / 1e6)
    return Transfer(mbps, marks[-1][1] if marks else 0, tuple(buckets))


def round_trips(
    src: Path,
    dst: Path,
    dst_ip: str,
    count: int,
    port: int = PORT + 1,
    until: threading.Event | None = None,
) -> list[float]:
    """Seconds of each of `count` 64-byte request/response exchanges over one TCP connection
    (an echo thread in `dst`), TCP_NODELAY; fewer if `until` is set meanwhile."""
    listener = _socket_in(dst)
    client = _socket_in(src)
    with listener, client:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((dst_ip, port))
        listener.listen(1)
        listener.settimeout(5)
        client.settimeout(5)
        client.connect((dst_ip, port))
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def echo() -> None:
            conn.settimeout(5)
            with conn:
                while True:
                    try:
                        data = conn.recv(64)
                    except OSError:
                        return
                    if not data:
                        return
                    conn.sendall(data)

        echoer = threading.Thread(target=echo, name="echo", daemon=True)
        echoer.start()
        message = b"x" * 64
        times = []
        for _ in range(count):
            if until is not None and until.is_set():
                break
            begin = time.perf_counter()
            client.sendall(message)
            got = 0
            while got < len(message):
                got += len(client.recv(64))
            times.append(time.perf_counter() - begin)
        client.shutdown(socket.SHUT_WR)
        echoer.join(5)
    return times
