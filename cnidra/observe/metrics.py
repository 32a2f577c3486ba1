"""Prometheus metrics of the driver (served on /metrics by cnidra.observe.http)."""

from __future__ import annotations

import platform
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from cnidra.observe.interfaces import InterfaceCollector
from cnidra.observe.ratelimits import RateLimitCollector

REGISTRY = CollectorRegistry()


def _version() -> str:
    try:
        return version("cnidra")
    except PackageNotFoundError:
        return "unknown"


BUILD = Info("cnidra_build", "The running cnidra: its version and Python's", registry=REGISTRY)
BUILD.info({"version": _version(), "python": platform.python_version()})

REQUESTS = Counter(
    "cnidra_dra_requests_total",
    "DRA plugin requests by method and outcome",
    ["method", "outcome"],
    registry=REGISTRY,
)
LATENCY = Histogram(
    "cnidra_dra_request_duration_seconds",
    "DRA plugin request latency by method",
    ["method"],
    registry=REGISTRY,
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
PREPARED_CLAIMS = Gauge(
    "cnidra_prepared_claims", "Claims in the node checkpoint", registry=REGISTRY
)
PUBLISHED_DEVICES = Gauge(
    "cnidra_published_devices", "Devices in this node's ResourceSlices", registry=REGISTRY
)
LAST_PUBLISH = Gauge(
    "cnidra_last_publish_timestamp_seconds",
    "When the ResourceSlices were last written",
    registry=REGISTRY,
)
PUBLISHES = Counter(
    "cnidra_slice_publishes_total",
    "ResourceSlice writes by outcome",
    ["outcome"],
    registry=REGISTRY,
)
HOOK_LATENCY = Histogram(
    "cnidra_nri_hook_duration_seconds",
    "Time inside NRI hooks by hook",
    ["hook"],
    registry=REGISTRY,
    buckets=(
        0.0005,
        0.001,
        0.0025,
        0.005,
        0.01,
        0.02,
        0.03,
        0.05,
        0.075,
        0.1,
        0.15,
        0.2,
        0.3,
        0.5,
        1,
        2,
    ),
)
CNI_EXEC = Histogram(
    "cnidra_cni_exec_duration_seconds",
    "CNI plugin runs by command (the part of the hook that is the plugins')",
    ["command"],
    registry=REGISTRY,
    buckets=(0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 0.5, 1, 5),
)
STATUS_LAG = Histogram(
    "cnidra_status_write_lag_seconds",
    "From a claim's status change queued (by a hook) to the apiserver having it",
    registry=REGISTRY,
    buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 30),
)


def observe_cni_exec(plugin_type: str, command: str, seconds: float) -> None:
    del plugin_type  # by command only: plugin types are tenant input, unbounded labels
    CNI_EXEC.labels(command).observe(seconds)


ATTACH_FAILURES = Counter(
    "cnidra_attach_failures_total",
    "Interfaces that could not be attached, by network and reason (a CNI error code's name, "
    "timeout, not-found, protocol, refused, cancelled)",
    ["network", "reason"],
    registry=REGISTRY,
)
DETACH_FAILURES = Counter(
    "cnidra_detach_failures_total",
    "DELs that failed (and are retried), by network and reason",
    ["network", "reason"],
    registry=REGISTRY,
)
_ATTACH_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1, 2, 5, 10)
ATTACH_DURATION = Histogram(
    "cnidra_attach_duration_seconds",
    "One interface's ADD (every plugin of its network), by network",
    ["network"],
    registry=REGISTRY,
    buckets=_ATTACH_BUCKETS,
)
DETACH_DURATION = Histogram(
    "cnidra_detach_duration_seconds",
    "One interface's DEL, by network",
    ["network"],
    registry=REGISTRY,
    buckets=_ATTACH_BUCKETS,
)
MAX_NETWORK_LABELS = 256
_networks: set[str] = set()


def network_label(name: str) -> str:
    """A network's name as a label value: names are users' (a claim's config, a NAD), so past
    MAX_NETWORK_LABELS distinct ones the rest are counted as "other" (bounded series)."""
    name = name or "unnamed"
    if name in _networks:
        return name
    if len(_networks) >= MAX_NETWORK_LABELS:
        return "other"
    _networks.add(name)
    return name


STATUS_WRITES = Counter(
    "cnidra_status_writes_total",
    "ResourceClaim status/finalizer writes by outcome",
    ["outcome"],
    registry=REGISTRY,
)
POD_WRITES = Counter(
    "cnidra_pod_writes_total",
    "Writes about pods (the network-status annotation, Events) by kind and outcome",
    ["kind", "outcome"],
    registry=REGISTRY,
)
APISERVER_REQUESTS = Counter(
    "cnidra_apiserver_requests_total",
    "Requests of the driver's apiserver client that got an answer, by verb (get, list, watch, "
    "create, update, patch, apply, delete), resource (with its subresource: "
    "resourceclaims/status) and HTTP code; retries are counted one by one",
    ["verb", "resource", "code"],
    registry=REGISTRY,
)
_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete", "GET": "get"}
_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{0,62}$")


def request_kind(
    method: str, path: str, query: str = "", content_type: str = ""
) -> tuple[str, str]:
    """(verb, resource) of an apiserver request, as Kubernetes names them: a GET of a
    collection is a list (a watch with watch=true), a PATCH with an apply body an apply, and
    the resource carries its subresource (`pods`, `resourceclaims/status`). Bounded: a path
    that is not the API's shape is counted as resource "other"."""
    parts = path.strip("/").split("/")
    if parts[:1] == ["api"]:
        rest = parts[2:]  # api/v1/...
    elif parts[:1] == ["apis"]:
        rest = parts[3:]  # apis/group/version/...
    else:
        rest = []
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]  # namespaces/<ns>/<resource>/...; namespaces/<name> is a namespace
    verb = _VERBS.get(method.upper(), "other")
    if not rest or not _NAME.match(rest[0]):
        return verb, "other"
    resource, named = rest[0], len(rest) >= 2
    if len(rest) >= 3 and _NAME.match(rest[2]):
        resource = f"{resource}/{rest[2]}"
    if verb == "get" and not named:
        verb = "watch" if re.search(r"(^|&)watch=(true|1)(&|$)", query) else "list"
    elif verb == "delete" and not named:
        verb = "deletecollection"
    elif verb == "patch" and content_type.startswith("application/apply-patch"):
        verb = "apply"
    return verb, resource


CLAIM_LOOKUPS = Counter(
    "cnidra_claim_lookups_total",
    "ResourceClaim GETs at prepare, or ahead of it, by result",
    ["result"],
    registry=REGISTRY,
)
CLAIMS_AHEAD = Counter(
    "cnidra_claims_ahead_total",
    "claims prepare looked for among those read ahead: hit (no GET), miss or stale (a GET)",
    ["result"],
    registry=REGISTRY,
)
CLAIMS_AHEAD_WAITED = Counter(
    "cnidra_claims_ahead_waited_total",
    "claims prepare found being read ahead (their GET under way) and waited for, not GET twice",
    registry=REGISTRY,
)
IPAM_BLOCKS_RESERVED = Counter(
    "cnidra_ipam_blocks_reserved_total",
    "CNIIPBlocks this node reserved: ahead, for the claims read ahead (prepare then asks the "
    "apiserver nothing), or at prepare, for a claim that found no free address in them",
    ["when"],
    registry=REGISTRY,
)
CLAIMS_AHEAD_JUDGED = Counter(
    "cnidra_claims_ahead_judgements_total",
    "claims prepare found read ahead: judgement made ahead used (used), or judged at prepare "
    "(again: the node's view changed since, or the judgement needs more than the view)",
    ["result"],
    registry=REGISTRY,
)
TASK_RESTARTS = Counter(
    "cnidra_task_restarts_total",
    "Background tasks restarted after they died, by task",
    ["task"],
    registry=REGISTRY,
)

POLICY_APPLY = Histogram(
    "cnidra_netpolicy_apply_seconds",
    "Time to apply one pod's network policy table change (one nft batch) after an event",
    buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5),
    registry=REGISTRY,
)


class PolicyDropCollector:
    """cnidra_netpolicy_dropped_packets_total, read on the scrape from the pods' policy
    tables (their counters: the default denies and the admin Deny rules), by network and policy
    (the rule's comment up to its direction: `ns/name`, `admin/name`, `default-deny`). The
    agent wires in `source`: (network, policy, packets) triples, read off the event loop."""

    def __init__(self) -> None:
        self.source: Callable[[], Iterable[tuple[str, str, int]]] = lambda: ()

    def collect(self) -> Iterator[Metric]:
        dropped = CounterMetricFamily(
            "cnidra_netpolicy_dropped_packets",
            "Packets network policy dropped on this node's pods, by network and policy",
            labels=["network", "policy"],
        )
        totals: dict[tuple[str, str], int] = {}
        for network, policy, packets in self.source():
            key = (network_label(network), policy)
            totals[key] = totals.get(key, 0) + packets
        for (network, policy), packets in sorted(totals.items()):
            dropped.add_metric([network, policy], packets)
        yield dropped


@dataclass(frozen=True)
class PoolUsage:
    """One CNIIPPool as this node holds it: its blocks, the addresses leased from them, and
    the addresses still free in them (None: the pool's shape is not known here yet)."""

    pool: str
    blocks: int
    leased: int
    free: int | None
    # the whole pool (every node's): addresses pods can get, and blocks
    size: int | None = None
    pool_blocks: int | None = None


class PoolCollector:
    """cnidra_ipam_node_blocks, cnidra_ipam_node_addresses and the pool's own size, computed
    on the scrape from the node's records and the pools it read last (no apiserver call); the
    agent wires in the source."""

    def __init__(self) -> None:
        self.source: Callable[[], Iterable[PoolUsage]] = lambda: ()

    def collect(self) -> Iterator[Metric]:
        blocks = GaugeMetricFamily(
            "cnidra_ipam_node_blocks", "CNIIPBlocks this node holds, by pool", labels=["pool"]
        )
        addresses = GaugeMetricFamily(
            "cnidra_ipam_node_addresses",
            "Addresses of this node's blocks by pool and state (leased, free)",
            labels=["pool", "state"],
        )
        size = GaugeMetricFamily(
            "cnidra_ipam_pool_size_addresses",
            "Addresses pods can get from the whole pool (every node's blocks), by pool",
            labels=["pool"],
        )
        pool_blocks = GaugeMetricFamily(
            "cnidra_ipam_pool_blocks",
            "Blocks the whole pool has; minus sum(cnidra_ipam_node_blocks): the free ones",
            labels=["pool"],
        )
        for usage in self.source():
            blocks.add_metric([usage.pool], usage.blocks)
            addresses.add_metric([usage.pool, "leased"], usage.leased)
            if usage.free is not None:
                addresses.add_metric([usage.pool, "free"], usage.free)
            if usage.size is not None:
                size.add_metric([usage.pool], usage.size)
            if usage.pool_blocks is not None:
                pool_blocks.add_metric([usage.pool], usage.pool_blocks)
        yield from (blocks, addresses, size, pool_blocks)


@dataclass(frozen=True)
class PoolAccount:
    """One CNIIPPool across the cluster, as the pool accountant counted it last."""

    pool: str
    size: int
    held: int
    free: int


class PoolAccountCollector:
    """cnidra_ipam_pool_addresses and cnidra_ipam_pool_used_ratio, per pool across every
    node, from the counts the pool accountant wrote last (a snapshot it replaces whole, read
    here without a lock; no apiserver call). Only the driver that holds the accountant's
    Lease exports them: sum or max over nodes gives the same."""

    def __init__(self) -> None:
        self.source: Callable[[], Iterable[PoolAccount]] = lambda: ()

    def collect(self) -> Iterator[Metric]:
        addresses = GaugeMetricFamily(
            "cnidra_ipam_pool_addresses",
            "Addresses of the whole pool by state (size, held, free), as the pool accountant "
            "counted them",
            labels=["pool", "state"],
        )
        used = GaugeMetricFamily(
            "cnidra_ipam_pool_used_ratio",
            "Share of the pool's addresses held, 0 to 1 (the alert fires at 0.9)",
            labels=["pool"],
        )
        for account in self.source():
            addresses.add_metric([account.pool, "size"], account.size)
            addresses.add_metric([account.pool, "held"], account.held)
            addresses.add_metric([account.pool, "free"], account.free)
            used.add_metric(
                [account.pool], min(account.held / account.size, 1.0) if account.size else 1.0
            )
        yield from (addresses, used)


POOLS = PoolCollector()
REGISTRY.register(POOLS)
POOL_ACCOUNTS = PoolAccountCollector()
REGISTRY.register(POOL_ACCOUNTS)
INTERFACES = InterfaceCollector()
REGISTRY.register(INTERFACES)
RATE_LIMITS = RateLimitCollector()
REGISTRY.register(RATE_LIMITS)
POLICY_DROPS = PolicyDropCollector()
REGISTRY.register(POLICY_DROPS)
