"""Per-interface counters read from pods' network namespaces on the scrape."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from cnidra.cni import netns
from cnidra.observe.interfaces import InterfaceCollector, PodInterface, parse_net_dev
from tests.conftest import ip
from tests.datapath.traffic import wait_for_carrier

HEADER = "Inter-| Receive | Transmit\n face |bytes packets errs drop ... |bytes packets ...\n"
NET_DEV = (
    HEADER
    + "    lo: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
    + "  net1:    1000      10    1    2    0     0    0    0"
    + "     2000      20    3    4    0     0    0    0\n"
)


def test_net_dev_rows_are_read_by_column() -> None:
    rows = parse_net_dev(NET_DEV)
    assert rows["net1"][:4] == [1000, 10, 1, 2]
    assert rows["net1"][8:12] == [2000, 20, 3, 4]
    assert set(rows) == {"lo", "net1"}


@given(st.text())
def test_any_text_parses_without_error(text: str) -> None:
    parse_net_dev(text)


def _scrape(collector: InterfaceCollector) -> str:
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()


@pytest.mark.netns
def test_a_pods_interface_counts_its_traffic_and_its_series_goes_with_it(
    node_netns: Path, pod_netns: Path
) -> None:
    ip(
        node_netns,
        "link",
        "add",
        "host1",
        "type",
        "veth",
        "peer",
        "name",
        "net1",
        "netns",
        str(pod_netns),
    )
    ip(node_netns, "addr", "add", "198.18.7.1/24", "dev", "host1")
    ip(node_netns, "link", "set", "host1", "up")
    ip(pod_netns, "addr", "add", "198.18.7.2/24", "dev", "net1")
    ip(pod_netns, "link", "set", "net1", "up")
    # a veth drops what is sent before both ends have carrier: wait for it, not for a time
    wait_for_carrier((node_netns, "host1"), (pod_netns, "net1"))
    live = [PodInterface(str(pod_netns), "team-a", "web-0", "web-0-net", "data", "net1")]
    collector = InterfaceCollector()
    collector.source = lambda: live
    labels = 'claim="web-0-net",interface="net1",namespace="team-a",pod="web-0",request="data"'

    def received() -> float:
        text = _scrape(collector)
        lines = [
            line
            for line in text.splitlines()
            if line.startswith("cnidra_pod_interface_receive_packets_total{") and labels in line
        ]
        assert lines, text
        return float(lines[0].rsplit(" ", 1)[1])

    with netns.entered(node_netns), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _ in range(5):  # queued behind ARP, then sent
            sock.sendto(b"x" * 100, ("198.18.7.2", 9))
    deadline = time.monotonic() + 10
    while received() < 6:  # the ARP request and the five datagrams
        assert time.monotonic() < deadline, f"only {received()} packets counted"
        time.sleep(0.05)
    text = _scrape(collector)
    assert "cnidra_pod_interface_transmit_bytes_total{" in text
    assert "cnidra_pod_interface_receive_drops_total{" in text
    live.clear()  # the record went with the pod
    assert "cnidra_pod_interface_receive_packets_total{" not in _scrape(collector)


def test_a_namespace_that_is_gone_is_left_out() -> None:
    collector = InterfaceCollector()
    collector.source = lambda: [PodInterface("/run/netns/cnidra-gone", "a", "b", "c", "d", "net1")]
    assert "cnidra_pod_interface_receive_bytes_total{" not in _scrape(collector)


def test_the_scrape_reads_a_bounded_number_of_namespaces_within_its_timeout() -> None:
    asked: list[list[str]] = []

    def slow(paths: Iterable[str], timeout: float) -> dict[str, dict[str, list[int]]]:
        asked.append(list(paths))
        return {}

    collector = InterfaceCollector(max_namespaces=3, read=slow)
    collector.source = lambda: [
        PodInterface(f"/run/netns/p{i}", "a", f"p{i}", "c", "r", "net1") for i in range(10)
    ]
    _scrape(collector)
    assert asked == [["/run/netns/p0", "/run/netns/p1", "/run/netns/p2"]]


def test_a_namespace_read_that_hangs_does_not_hold_the_scrape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scrape returns within its timeout while its reader thread is stuck entering a
    namespace; the thread is released afterwards and ends (no thread left behind)."""
    from cnidra.observe import interfaces

    reached, release = threading.Event(), threading.Event()

    def stuck(path: str) -> object:
        reached.set()
        release.wait(10)  # bounded: a scrape that waits for it fails below, it does not hang
        raise OSError("never")

    monkeypatch.setattr(interfaces, "entered", stuck)
    before = set(threading.enumerate())
    started = time.monotonic()
    try:
        assert interfaces.read_namespaces(["/run/netns/x"], 0.3) == {}
        assert time.monotonic() - started < 5  # not the stuck read's 10 s; 2 s was a slow machine's
        assert reached.wait(30)  # the reader gets to the namespace (a loaded machine: later), stuck
        new = set(threading.enumerate()) - before
        [reader] = [t for t in new if t.name == "interface-counters"]
    finally:
        release.set()
    reader.join(5)
    assert not reader.is_alive()
