"""bench.pod_ready's figures of what cnidra's driver costs per pod, without the test bed: its
apiserver requests read from its own /metrics, and the rounds added up."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest

from bench.pod_ready import AuditWindow, DriverCost, PeerCost, requests_by_kind, user
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


def audit_event(peer: str, verb: str, resource: str | None, sub: str = "", **extra: Any) -> str:
    event: dict[str, Any] = {
        "kind": "Event",
        "stage": "RequestReceived",
        "verb": verb,
        "user": {"username": user(peer)},
        "userAgent": f"{peer}/v1 (linux/amd64) kubernetes/abc",
        "requestURI": "/api/v1/namespaces/ns/pods/p?timeout=10s",
        **extra,
    }
    if resource is not None:
        event["objectRef"] = {"resource": resource, "subresource": sub or None, "name": "p"}
    return json.dumps(event) + "\n"


def test_a_peers_requests_are_counted_from_the_audit_log_in_its_window(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    log.write_text(audit_event("multus", "get", "pods"))  # before the window
    window = AuditWindow(log)
    window.start()
    with open(log, "a") as f:
        f.write(audit_event("multus", "get", "pods"))
        f.write(audit_event("multus", "get", "pods"))
        f.write(audit_event("multus", "update", "pods", "status"))
        f.write(audit_event("multus", "create", "events"))
        f.write(audit_event("multus", "get", None))  # a non-resource request: its path
        f.write(audit_event("multus", "get", "pods", stage="ResponseComplete"))  # not again
        f.write(audit_event("dra-example", "get", "resourceclaims"))  # another peer's
        f.write("not json\n")
    kinds, agents = window.end("multus")
    assert kinds == {
        "get pods": 2,
        "update pods/status": 1,
        "create events": 1,
        "get /api/v1/namespaces/ns/pods/p": 1,
    }
    assert agents == {"multus/v1"}
    assert window.end("dra-example")[0] == {"get resourceclaims": 1}
    cost = PeerCost()
    cost.requests.update(kinds)
    cost.pods = 2
    figures = cost.per_pod()
    assert figures["apiserver_requests_per_pod"] == 2.5
    assert figures["apiserver_requests_per_pod_by_kind"]["get pods"] == 1.0


def test_a_rotated_audit_log_is_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    log.write_text(audit_event("multus", "get", "pods") * 5)
    window = AuditWindow(log)
    window.start()
    log.write_text(audit_event("multus", "create", "events"))  # rotated: a new, shorter file
    assert window.end("multus")[0] == {"create events": 1}
