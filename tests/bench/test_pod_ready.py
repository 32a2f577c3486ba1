"""bench.pod_ready's figures of what cnidra's driver costs per pod, without the test bed: its
apiserver requests read from its own /metrics, and the rounds added up."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest

from bench.pod_ready import DriverCost, requests_by_kind
from cnidra.observe import metrics


def exposition(counts: dict[tuple[str, str, str], float]) -> str:
    """/metrics as the driver serves it, with these request counts and other series around."""
    registry = CollectorRegistry()
    requests = Counter(
        "cnidra_apiserver_requests_total", "", ["verb", "resource", "code"], registry=registry
    )
    other = Counter("cnidra_status_writes_total", "", ["outcome"], registry=registry)
    other.labels("ok").inc(7)
    for (verb, resource, code), value in counts.items():
        requests.labels(verb, resource, code).inc(value)
    return generate_latest(registry).decode()


def test_requests_are_read_by_kind_over_every_code() -> None:
    text = exposition(
        {
            ("get", "resourceclaims", "200"): 3,
            ("apply", "resourceclaims/status", "200"): 2,
            ("apply", "resourceclaims/status", "429"): 1,
            ("patch", "pods", "200"): 3,
        }
    )
    assert requests_by_kind(text) == {
        "get resourceclaims": 3.0,
        "apply resourceclaims/status": 3.0,
        "patch pods": 3.0,
    }
    assert requests_by_kind("") == {}


def test_the_drivers_own_series_is_read() -> None:
    """The name and labels the driver exports (cnidra.observe.metrics), not a copy of them."""
    metrics.APISERVER_REQUESTS.labels("create", "events", "201").inc(0)
    text = generate_latest(metrics.REGISTRY).decode()
    assert "create events" in requests_by_kind(text)


def test_rounds_add_up_to_figures_per_pod() -> None:
    cost = DriverCost()
    cost.add(
        0.6,
        {"get resourceclaims": 10.0, "list cninetworks": 4.0},
        {"get resourceclaims": 30.0, "list cninetworks": 5.0, "patch pods": 20.0},
        20,
    )
    cost.add(0.4, {}, {"get resourceclaims": 20.0, "patch pods": 20.0}, 20)
    assert cost.per_pod() == {
        "cpu_ms_per_pod": 25.0,
        "apiserver_requests_per_pod": 2.02,
        "apiserver_requests_per_pod_by_kind": {
            "get resourceclaims": 1.0,
            "list cninetworks": 0.03,
            "patch pods": 1.0,
        },
    }
    assert DriverCost().per_pod()["apiserver_requests_per_pod"] == 0.0
