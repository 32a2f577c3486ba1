"""Per-interface rate limits (issue 44): the limit each shaped pod interface holds in each
direction, and what the limit dropped and held back, read on the scrape.

observe cannot import the datapath (the same layer), so the agent passes the reader: a
function from a namespace and its interfaces to what each holds (cnidra.datapath.shaping's
`read_many`, whose results have the shape of `InterfaceLimits`). The scrape reads one
namespace at a time, within READ_TIMEOUT_SECONDS in all: what is not read in time, or cannot
be read (the pod is going), is left out of that scrape, never blocks it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from cnidra.observe.interfaces import LABELS, MAX_NAMESPACES, PodInterface

log = logging.getLogger(__name__)

READ_TIMEOUT_SECONDS = 2.0
DIRECTIONS = ("egress", "ingress")  # what the pod sends, what it receives


class DirectionLimit(Protocol):
    """One direction's limit and its counters since it was applied."""

    @property
    def rate(self) -> int: ...  # bits per second
    @property
    def ceil(self) -> int: ...
    @property
    def drops(self) -> int: ...
    @property
    def overlimits(self) -> int: ...


class InterfaceLimits(Protocol):
    @property
    def egress(self) -> DirectionLimit | None: ...
    @property
    def ingress(self) -> DirectionLimit | None: ...


# (namespace path, interface names, timeout in seconds) -> what each interface holds; an
# interface that is not there is left out; any exception: the namespace is left out
LimitReader = Callable[[str, Sequence[str], float], Mapping[str, InterfaceLimits]]


def _no_reader(netns: str, names: Sequence[str], timeout: float) -> Mapping[str, InterfaceLimits]:
    return {}


class RateLimitCollector:
    """cnidra_pod_interface_rate_limit_bits_per_second, ..._rate_ceiling_bits_per_second,
    ..._shaped_drops_total and ..._shaped_overlimits_total, by interface and direction. The
    agent wires in the source (the attached interfaces that have a rate limit) and the
    reader."""

    def __init__(
        self,
        max_namespaces: int = MAX_NAMESPACES,
        timeout: float = READ_TIMEOUT_SECONDS,
    ) -> None:
        self.source: Callable[[], Iterable[PodInterface]] = lambda: ()
        self.read: LimitReader = _no_reader
        self.max_namespaces = max_namespaces
        self.timeout = timeout

    def collect(self) -> Iterator[Metric]:
        labels = [*LABELS, "direction"]
        rate = GaugeMetricFamily(
            "cnidra_pod_interface_rate_limit_bits_per_second",
            "The rate an interface is held to (its claim's reservation), per direction",
            labels=labels,
        )
        ceiling = GaugeMetricFamily(
            "cnidra_pod_interface_rate_ceiling_bits_per_second",
            "The most an interface reaches by bursting (equal to the rate: no bursts)",
            labels=labels,
        )
        drops = CounterMetricFamily(
            "cnidra_pod_interface_shaped_drops",
            "Packets the interface's rate limit dropped (its queue was full)",
            labels=labels,
        )
        overlimits = CounterMetricFamily(
            "cnidra_pod_interface_shaped_overlimits",
            "Times the interface's rate limit held a packet back for being over the rate",
            labels=labels,
        )
        by_netns: dict[str, list[PodInterface]] = {}
        for interface in self.source():
            by_netns.setdefault(interface.netns, []).append(interface)
        deadline = time.monotonic() + self.timeout
        for netns, interfaces in list(by_netns.items())[: self.max_namespaces]:
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("rate limits: namespaces not read within %gs", self.timeout)
                break
            try:
                found = self.read(netns, [i.interface for i in interfaces], left)
            except Exception as exc:  # the pod is going, or its namespace cannot be read
                log.debug("rate limits of %s: %s", netns, exc)
                continue
            for interface in interfaces:
                limits = found.get(interface.interface)
                if limits is None:
                    continue
                for name in DIRECTIONS:
                    direction: DirectionLimit | None = getattr(limits, name)
                    if direction is None:
                        continue
                    values = [*interface.labels(), name]
                    rate.add_metric(values, direction.rate)
                    ceiling.add_metric(values, direction.ceil)
                    drops.add_metric(values, direction.drops)
                    overlimits.add_metric(values, direction.overlimits)
        yield from (rate, ceiling, drops, overlimits)

    def describe(self) -> Iterator[Metric]:
        return iter(())
