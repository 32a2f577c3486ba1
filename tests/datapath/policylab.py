"""Three "pods" on one L2 segment, for the network policy tests: namespaces of this run (their
names carry its tag) joined by veths to a bridge in a fourth namespace, addresses from
198.18.0.0/15 and 2001:db8::/32, echo servers for TCP and UDP in every pod, and probes that
say whether a connection or a datagram round trip got through. Everything bounded in time and
removed whatever happens; the machine's own interfaces are never touched."""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from cnidra.cni import netns
from cnidra.util.netns import entered

IFNAME = "net1"
PREFIX = "198.18.43"
PREFIX6 = "2001:db8:43::"  # the IPv6 documentation range
TCP_PORTS = (8080, 5432, 3050, 3200)
UDP_PORTS = (5353, 9000)
PROBE_SECONDS = 0.6


def ip(ns: Path, *args: str) -> None:
    subprocess.run(["ip", "-n", ns.name, *args], check=True, capture_output=True, timeout=10)


def socket_in(ns: Path, kind: int, family: int = socket.AF_INET) -> socket.socket:
    with entered(ns):
        return socket.socket(family, kind)


def dual_stack(ns: Path, kind: int) -> socket.socket:
    """An IPv6 socket that takes IPv4 too (as v4-mapped addresses)."""
    s = socket_in(ns, kind, socket.AF_INET6)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    return s


@dataclass
class Servers:
    """TCP and UDP echo servers in one namespace, on every port of TCP_PORTS and UDP_PORTS."""

    ns: Path
    stop: threading.Event = field(default_factory=threading.Event)
    sockets: list[socket.socket] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        sel = selectors.DefaultSelector()
        for port in TCP_PORTS:
            s = dual_stack(self.ns, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("::", port))
            s.listen(64)
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ, "tcp")
            self.sockets.append(s)
        for port in UDP_PORTS:
            u = dual_stack(self.ns, socket.SOCK_DGRAM)
            u.bind(("::", port))
            u.setblocking(False)
            sel.register(u, selectors.EVENT_READ, "udp")
            self.sockets.append(u)

        def loop() -> None:
            while not self.stop.is_set():
                for key, _ in sel.select(0.05):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    try:
                        if key.data == "udp":
                            data, peer = sock.recvfrom(2048)
                            sock.sendto(data, peer)
                        else:
                            conn, _ = sock.accept()
                            self._echo(conn)
                    except OSError:
                        continue
            sel.close()

        t = threading.Thread(target=loop, daemon=True, name="policy-servers")
        t.start()
        self.threads.append(t)

    def _echo(self, conn: socket.socket) -> None:
        conn.settimeout(0.1)
        self.sockets.append(conn)

        def echo() -> None:
            with conn:
                while not self.stop.is_set():
                    try:
                        data = conn.recv(4096)
                    except TimeoutError:
                        continue
                    except OSError:
                        return
                    if not data:
                        return
                    try:
                        conn.sendall(data)
                    except OSError:
                        return

        t = threading.Thread(target=echo, daemon=True, name="policy-echo")
        t.start()
        self.threads.append(t)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(2)
        for s in self.sockets:
            with contextlib.suppress(OSError):
                s.close()


@dataclass
class Lab:
    pods: dict[str, Path]  # pod name -> its namespace
    addresses: dict[str, str]
    addresses6: dict[str, str]
    host: Path | None = None  # the routed lab's "node": the host's ends of the pods' veths
    switch: Path | None = None  # the bridged lab's: its bridge BRIDGE and the pods' ports

    def probe(self, src: str, dst: str, proto: str, port: int) -> bool:
        """Whether a TCP connection (and an echo over it), or a UDP datagram and its echo, from
        `src` reaches `dst`'s port on the segment and back; `proto` tcp or udp over IPv4, tcp6
        or udp6 over IPv6."""
        kind = socket.SOCK_STREAM if proto.startswith("tcp") else socket.SOCK_DGRAM
        v6 = proto.endswith("6")
        family = socket.AF_INET6 if v6 else socket.AF_INET
        address = (self.addresses6 if v6 else self.addresses)[dst]
        sock = socket_in(self.pods[src], kind, family)
        sock.settimeout(PROBE_SECONDS)
        try:
            if kind == socket.SOCK_STREAM:
                sock.connect((address, port))
                sock.sendall(b"probe")
                return sock.recv(16) == b"probe"
            sock.sendto(b"probe", (address, port))
            data, _ = sock.recvfrom(16)
            return data == b"probe"
        except OSError:  # a timeout, a reset, unreachable
            return False
        finally:
            sock.close()

    def probes(self, rows: list[tuple[str, str, str, int]]) -> list[bool]:
        """Many probes at once (each a denied one costs its timeout)."""
        with ThreadPoolExecutor(max_workers=8) as pool:
            return list(pool.map(lambda r: self.probe(*r), rows))

    def readdress(self, pod: str, address: str) -> None:
        ns = self.pods[pod]
        ip(ns, "addr", "del", f"{self.addresses[pod]}/24", "dev", IFNAME)
        ip(ns, "addr", "add", f"{address}/24", "dev", IFNAME)
        self.addresses[pod] = address


@contextlib.contextmanager
def lab(names: tuple[str, ...] = ("a", "b", "c")) -> Iterator[Lab]:
    """`names` pods, each `IFNAME` with PREFIX.<n>/24, on a bridge of a namespace of its own."""
    with contextlib.ExitStack() as stack:
        switch = stack.enter_context(netns.temporary("cnidra-np-sw"))
        ip(switch, "link", "add", "br0", "type", "bridge")
        ip(switch, "link", "set", "br0", "up")
        pods: dict[str, Path] = {}
        addresses: dict[str, str] = {}
        addresses6: dict[str, str] = {}
        for n, name in enumerate(names, start=1):
            ns = stack.enter_context(netns.temporary(f"cnidra-np-{name}"))
            port = f"p-{name}"
            ip(
                switch,
                "link",
                "add",
                port,
                "type",
                "veth",
                "peer",
                "name",
                IFNAME,
                "netns",
                ns.name,
            )
            ip(switch, "link", "set", port, "master", "br0")
            ip(switch, "link", "set", port, "up")
            address = f"{PREFIX}.{n}"
            ip(ns, "addr", "add", f"{address}/24", "dev", IFNAME)
            ip(ns, "addr", "add", f"{PREFIX6}{n}/64", "dev", IFNAME, "nodad")
            ip(ns, "link", "set", IFNAME, "up")
            pods[name] = ns
            addresses[name] = address
            addresses6[name] = f"{PREFIX6}{n}"
            srv = Servers(ns)
            stack.callback(srv.close)  # before its namespace goes
            srv.start()
        yield Lab(pods, addresses, addresses6, switch=switch)


BRIDGE = "br0"


def port_of(pod: str) -> str:
    """The pod's port on the bridged lab's bridge (the host's end of its veth)."""
    return f"p-{pod}"


def mac_of(ns: Path, ifname: str = IFNAME) -> str:
    shown = subprocess.run(
        ["ip", "-n", ns.name, "-j", "link", "show", ifname],
        check=True, capture_output=True, text=True, timeout=10,
    )  # fmt: skip
    return str(json.loads(shown.stdout)[0]["address"])


ROUTED = "198.18.44"  # the routed lab's pods
GATEWAY = "198.18.45.1"  # on every host veth, as the ptp plugin puts it


def host_veth(pod: str) -> str:
    return f"h-{pod}"


@contextlib.contextmanager
def routed_lab(names: tuple[str, ...] = ("a", "b", "c")) -> Iterator[Lab]:
    """`names` pods wired as the ptp plugin wires them: each `IFNAME` with ROUTED.<n>/32, a
    veth whose other end (`host_veth`) is in a "node" namespace of this run that routes
    between them (GATEWAY on each host end, a /32 route to each pod), echo servers in every
    pod. IPv4 only."""
    with contextlib.ExitStack() as stack:
        host = stack.enter_context(netns.temporary("cnidra-np-host"))
        subprocess.run(
            ["ip", "netns", "exec", host.name, "sysctl", "-qw", "net.ipv4.ip_forward=1"],
            check=True,
            capture_output=True,
            timeout=10,
        )
        ip(host, "link", "set", "lo", "up")
        pods: dict[str, Path] = {}
        addresses: dict[str, str] = {}
        for n, name in enumerate(names, start=1):
            ns = stack.enter_context(netns.temporary(f"cnidra-np-{name}"))
            end = host_veth(name)
            ip(host, "link", "add", end, "type", "veth", "peer", "name", IFNAME, "netns", ns.name)
            address = f"{ROUTED}.{n}"
            ip(host, "addr", "add", f"{GATEWAY}/32", "dev", end)
            ip(host, "link", "set", end, "up")
            ip(host, "route", "add", f"{address}/32", "dev", end)
            ip(ns, "addr", "add", f"{address}/32", "dev", IFNAME)
            ip(ns, "link", "set", IFNAME, "up")
            ip(ns, "link", "set", "lo", "up")
            ip(ns, "route", "add", f"{GATEWAY}/32", "dev", IFNAME)
            ip(ns, "route", "add", f"{ROUTED}.0/24", "via", GATEWAY, "dev", IFNAME)
            pods[name] = ns
            addresses[name] = address
            srv = Servers(ns)
            stack.callback(srv.close)
            srv.start()
        yield Lab(pods, addresses, {}, host)


SO_RCVBUFFORCE = 33  # Linux's; the socket module does not name it


@dataclass
class Stream:
    """Datagrams sent about every millisecond from pods to one port of another, counted where
    they arrive, by source address."""

    sent: int = 0
    got: dict[str, int] = field(default_factory=dict)
    # datagrams the kernel dropped meanwhile outside any policy (full queues, a starved
    # receiver: kernel_drops), which a loaded machine can show; a policy's drops are not among
    # them, so `sent - got[allowed] <= kernel_drops` still fails on a window of a policy
    kernel_drops: int = 0


def kernel_drops(lab_: Lab) -> int:
    """Packets the kernel dropped outside nftables in the lab's namespaces: UDP receive errors
    (a full socket buffer), every link's rx/tx drops (a veth's peer whose queue was full),
    and the machine's backlog drops (/proc/net/softnet_stat, the second column)."""
    total = 0
    for ns in {*lab_.pods.values(), *([lab_.host] if lab_.host else [])}:
        nsenter = ["nsenter", f"--net={ns}"]
        snmp = subprocess.run(
            [*nsenter, "cat", "/proc/net/snmp"], capture_output=True, text=True, check=True
        ).stdout.splitlines()
        udp = [line.split()[1:] for line in snmp if line.startswith("Udp:")]
        if len(udp) == 2:
            total += int(dict(zip(udp[0], udp[1], strict=True)).get("InErrors", "0"))
        links = subprocess.run(
            [*nsenter, "ip", "-s", "-j", "link"], capture_output=True, text=True, check=True
        ).stdout
        for link in json.loads(links):
            stats = link.get("stats64", {})
            total += int(stats.get("rx", {}).get("dropped", 0))
            total += int(stats.get("tx", {}).get("dropped", 0))
    with open("/proc/net/softnet_stat") as f:
        total += sum(int(line.split()[1], 16) for line in f if line.strip())
    return total


@contextlib.contextmanager
def stream(lab_: Lab, dst: str, port: int, sources: tuple[str, ...]) -> Iterator[Stream]:
    """Streams while the body runs; the counts are final once it is left."""
    result = Stream(got={lab_.addresses[p]: 0 for p in sources})
    receiver = socket_in(lab_.pods[dst], socket.SOCK_DGRAM)
    receiver.bind((lab_.addresses[dst], port))
    receiver.settimeout(0.05)
    receiver.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)
    senders = [socket_in(lab_.pods[p], socket.SOCK_DGRAM) for p in sources]
    stop, drained = threading.Event(), threading.Event()

    def receive() -> None:
        # until told the senders are done and then nothing came for a timeout's while: what is
        # still queued in the socket is counted too, however late this thread runs
        while True:
            try:
                _, (source, _) = receiver.recvfrom(64)
                result.got[source] = result.got.get(source, 0) + 1
            except OSError:  # a timeout
                if drained.is_set():
                    return

    def send() -> None:
        while not stop.is_set():
            for sender in senders:
                sender.sendto(b"x", (lab_.addresses[dst], port))
            result.sent += 1
            time.sleep(0.001)

    threads = [threading.Thread(target=f, daemon=True) for f in (receive, send)]
    dropped = kernel_drops(lab_)
    for t in threads:
        t.start()
    try:
        yield result
    finally:
        stop.set()
        threads[1].join(2)
        time.sleep(0.3)  # what is on its way arrives
        drained.set()
        threads[0].join(10)
        result.kernel_drops = kernel_drops(lab_) - dropped
        for s in (receiver, *senders):
            s.close()
