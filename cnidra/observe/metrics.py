"""Prometheus metrics of the driver (served on /metrics by cnidra.observe.http)."""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

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
    "cnidra_attach_failures_total", "RunPodSandbox hooks that failed", registry=REGISTRY
)
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
CLAIM_LOOKUPS = Counter(
    "cnidra_claim_lookups_total",
    "ResourceClaim GETs at prepare by result",
    ["result"],
    registry=REGISTRY,
)
TASK_RESTARTS = Counter(
    "cnidra_task_restarts_total",
    "Background tasks restarted after they died, by task",
    ["task"],
    registry=REGISTRY,
)
