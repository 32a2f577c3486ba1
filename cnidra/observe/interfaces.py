"""Per-interface traffic counters of every interface cnidra attached: read on the scrape from
each pod's network namespace, so a series exists exactly as long as the interface's record.

How: one short-lived thread per scrape enters each pod's namespace in turn (setns(2)) and
reads /proc/thread-self/net/dev, the kernel's counters of that namespace's links; the thread
then returns home and ends (a thread is never reused after it has moved). Cost: two setns
calls and one small file read per pod, no process, no netlink socket; bounded by
MAX_NAMESPACES namespaces and READ_TIMEOUT_SECONDS per scrape (what is not read in time is
left out of that scrape, never blocks it)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from cnidra.util.netns import entered

log = logging.getLogger(__name__)

MAX_NAMESPACES = 512  # kubelet's default is 110 pods per node
READ_TIMEOUT_SECONDS = 2.0
LABELS = ["namespace", "pod", "claim", "request", "interface"]

# /proc/net/dev columns after the name: receive bytes packets errs drop fifo frame compressed
# multicast, transmit bytes packets errs drop fifo colls carrier compressed
_COLUMNS = {
    "receive_bytes": 0,
    "receive_packets": 1,
    "receive_errors": 2,
    "receive_drops": 3,
    "transmit_bytes": 8,
    "transmit_packets": 9,
    "transmit_errors": 10,
    "transmit_drops": 11,
}
_HELP = {
    "receive_bytes": "Bytes received",
    "receive_packets": "Packets received",
    "receive_errors": "Receive errors",
    "receive_drops": "Received packets dropped",
    "transmit_bytes": "Bytes transmitted",
    "transmit_packets": "Packets transmitted",
    "transmit_errors": "Transmit errors",
    "transmit_drops": "Transmitted packets dropped",
}


@dataclass(frozen=True)
class PodInterface:
    """An interface cnidra attached, where it lives and whose it is."""

    netns: str
    namespace: str
    pod: str
    claim: str
    request: str
    interface: str

    def labels(self) -> list[str]:
        return [self.namespace, self.pod, self.claim, self.request, self.interface]


def parse_net_dev(text: str) -> dict[str, list[int]]:
    """The counters of /proc/net/dev by link name (the two header lines skipped)."""
    counters: dict[str, list[int]] = {}
    for line in text.splitlines()[2:]:
        name, sep, rest = line.partition(":")
        fields = rest.split()
        if not sep or len(fields) < 16:
            continue
        try:
            counters[name.strip()] = [int(f) for f in fields[:16]]
        except ValueError:
            continue
    return counters


def read_namespaces(paths: Iterable[str], timeout: float) -> dict[str, dict[str, list[int]]]:
    """/proc/net/dev of each namespace, read from one new thread; those it has not reached
    when `timeout` runs out (or could not enter: the pod is going) are missing."""
    found: dict[str, dict[str, list[int]]] = {}
    todo = list(paths)

    def read_all() -> None:
        for path in todo:
            try:
                with entered(path), open("/proc/thread-self/net/dev") as dev:
                    text = dev.read()
            except OSError as exc:
                log.debug("interface counters of %s: %s", path, exc)
                continue
            found[path] = parse_net_dev(text)

    reader = threading.Thread(target=read_all, name="interface-counters", daemon=True)
    reader.start()
    reader.join(timeout)
    if reader.is_alive():
        log.warning("interface counters: %d namespaces not read within %gs", len(todo), timeout)
    return dict(found)


class InterfaceCollector:
    """cnidra_pod_interface_{receive,transmit}_{bytes,packets,errors,drops}_total; the agent
    wires in the source (the sandbox records of attached pods)."""

    def __init__(
        self,
        max_namespaces: int = MAX_NAMESPACES,
        timeout: float = READ_TIMEOUT_SECONDS,
        read: Callable[[Iterable[str], float], dict[str, dict[str, list[int]]]] = read_namespaces,
    ) -> None:
        self.source: Callable[[], Iterable[PodInterface]] = lambda: ()
        self.max_namespaces = max_namespaces
        self.timeout = timeout
        self._read = read

    def collect(self) -> Iterator[Metric]:
        families = {
            key: CounterMetricFamily(f"cnidra_pod_interface_{key}", _HELP[key], labels=LABELS)
            for key in _COLUMNS
        }
        interfaces = list(self.source())
        namespaces = list(dict.fromkeys(i.netns for i in interfaces))[: self.max_namespaces]
        counters = self._read(namespaces, self.timeout) if namespaces else {}
        for interface in interfaces:
            values = counters.get(interface.netns, {}).get(interface.interface)
            if values is None:
                continue
            for key, column in _COLUMNS.items():
                families[key].add_metric(interface.labels(), values[column])
        yield from families.values()

    def describe(self) -> Iterator[Metric]:
        return iter(())
