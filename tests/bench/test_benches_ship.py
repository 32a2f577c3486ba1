"""Benchmarks run the driver against what the chart ships.

- Its CRDs are served before it starts: without them the driver measures its own 404 retries
  (the CNINetwork watch and the IPAM pass every few seconds), which a cluster installed with
  the chart never sees.
- What they send it passes the shipped policy: a claim network the DeviceClass refuses
  (host-local written by a claim, cnidra.api.policy.SEGMENT_BLIND_IPAM) fails every prepare,
  so the benchmark measures refusals or stops at its first pod. Each benchmark that starts a
  driver says what it sends in `policy_samples()` (bench/pools.py), built by its own
  functions; here those are judged as the admission webhook and prepare judge them, with
  deploy/deviceclass.yaml, and the CNIIPPools they name must serve them (their `namespaces`
  naming the claim's, a tenant's static address inside one) in a range of the benchmark's
  own inside 198.18.0.0/15."""

from __future__ import annotations

import importlib
import ipaddress
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cnidra.api.validate import validate_documents

ROOT = Path(__file__).parents[2]
BENCH = ROOT / "bench"
SHIPPED = [d for d in yaml.safe_load_all((ROOT / "deploy" / "deviceclass.yaml").read_text()) if d]
BENCH_RANGE = ipaddress.ip_network("198.18.0.0/15")
CLAIM_KINDS = ("ResourceClaim", "ResourceClaimTemplate")
CNIDRA_DRIVER = "cni.dra.networking.x-k8s.io"
# how a benchmark runs cnidra's driver: the test bed's process, the prepare path wired in
# process (bench.prepare_inproc), the driver on a fake node (tests/fakenode.py, bench.pod_cpu)
DRIVER_STARTS = ("DriverProcess(", "Preparer(", "FakeNode(")


def _benches() -> list[Path]:
    return sorted(p for p in BENCH.glob("*.py") if p.name != "__init__.py")


STARTS_A_DRIVER = [p for p in _benches() if "DriverProcess(" in p.read_text()]
RUNS_THE_DRIVER = [p for p in _benches() if any(s in p.read_text() for s in DRIVER_STARTS)]
# those, and any other benchmark that says what it sends (bench.fleet: its pods' claims)
SAMPLED = sorted(
    set(RUNS_THE_DRIVER) | {p for p in _benches() if "def policy_samples(" in p.read_text()}
)


def samples(path: Path) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = importlib.import_module(f"bench.{path.stem}").policy_samples()
    return docs


def claims_of(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") in CLAIM_KINDS]


def pools_of(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d.get("kind") == "CNIIPPool"}


def ipams(obj: Any) -> Iterator[dict[str, Any]]:
    """Every `ipam` object anywhere in `obj` (a claim's configs, a template's)."""
    if isinstance(obj, dict):
        if isinstance(obj.get("ipam"), dict):
            yield obj["ipam"]
        for value in obj.values():
            yield from ipams(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from ipams(value)


def carries_a_cniconfig(obj: Any) -> bool:
    if isinstance(obj, dict):
        opaque = obj.get("opaque")
        if isinstance(opaque, dict) and opaque.get("driver") == CNIDRA_DRIVER:
            return (opaque.get("parameters") or {}).get("kind") == "CNIConfig"
        return any(carries_a_cniconfig(v) for v in obj.values())
    if isinstance(obj, list):
        return any(carries_a_cniconfig(v) for v in obj)
    return False


def subnets(pool: dict[str, Any]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(r["subnet"]) for r in pool["spec"]["ranges"]]


def test_some_benchmarks_start_the_driver() -> None:
    assert len(STARTS_A_DRIVER) >= 5
    assert {"prepare_inproc", "pod_cpu", "pod_ready", "driver_latency"} <= {
        p.stem for p in RUNS_THE_DRIVER
    }


@pytest.mark.parametrize("path", STARTS_A_DRIVER, ids=lambda p: p.stem)
def test_a_benchmark_that_starts_the_driver_installs_the_chart_api(path: Path) -> None:
    assert "install_cnidra_api()" in path.read_text(), (
        f"bench/{path.name} starts the driver without the chart's CRDs: call "
        "Cluster.install_cnidra_api() first"
    )


@pytest.mark.parametrize("path", RUNS_THE_DRIVER, ids=lambda p: p.stem)
def test_a_benchmark_that_runs_the_driver_says_what_it_sends(path: Path) -> None:
    assert "def policy_samples(" in path.read_text(), (
        f"bench/{path.name} runs cnidra's driver: define policy_samples() returning the claims "
        "or templates it sends (with their namespace) and the CNIIPPools they name, built by "
        "the functions the benchmark uses (bench/pools.py)"
    )
    assert any(carries_a_cniconfig(c) for c in claims_of(samples(path)))


@pytest.mark.parametrize("path", SAMPLED, ids=lambda p: p.stem)
def test_what_a_benchmark_sends_passes_the_shipped_policy(path: Path) -> None:
    reports = validate_documents(claims_of(samples(path)), SHIPPED, {})
    judged = [r for r in reports if r.skipped is None]
    assert judged, f"bench/{path.name}: none of its samples is cnidra's to judge"
    refused = {
        f"{r.kind} {r.name}": [f"{i.path}: {i.message}" for i in r.issues.errors]
        for r in judged
        if r.issues.errors
    }
    assert not refused, f"bench/{path.name} sends what the shipped policy refuses: {refused}"


@pytest.mark.parametrize("path", SAMPLED, ids=lambda p: p.stem)
def test_the_pools_a_benchmark_names_serve_its_claims(path: Path) -> None:
    docs = samples(path)
    pools = pools_of(docs)
    for claim in claims_of(docs):
        namespace = claim["metadata"].get("namespace")
        where = f"bench/{path.name}: {claim['kind']} {claim['metadata']['name']}"
        assert namespace, f"{where} has no namespace (bench.pools.in_namespace)"
        for ipam in ipams(claim):
            assert ipam.get("type") != "host-local", f"{where}: host-local in a claim"
            if ipam.get("type") == "cnidra":
                pool = pools.get(ipam.get("pool", ""))
                assert pool is not None, f"{where} names pool {ipam.get('pool')}, not made"
                assert namespace in pool["spec"].get("namespaces", []), (
                    f"{where}: pool {ipam['pool']} does not serve namespace {namespace}"
                )
            for entry in ipam.get("addresses", []) if ipam.get("type") == "static" else []:
                address = ipaddress.ip_interface(entry["address"])
                owners = [
                    name
                    for name, pool in pools.items()
                    if namespace in pool["spec"].get("namespaces", [])
                    and any(address.ip in net for net in subnets(pool))
                ]
                assert owners, f"{where}: static {address} lies in no pool serving {namespace}"
    for name, pool in pools.items():
        for net in subnets(pool):
            assert net.subnet_of(BENCH_RANGE), f"bench/{path.name}: pool {name} {net}"  # type: ignore[arg-type]


def test_no_two_benchmarks_share_a_pool_range() -> None:
    ranges = [
        (path.stem, name, net)
        for path in SAMPLED
        for name, pool in pools_of(samples(path)).items()
        for net in subnets(pool)
    ]
    assert ranges
    shared = [
        f"{a[0]} {a[1]} {a[2]} and {b[0]} {b[1]} {b[2]}"
        for a, b in itertools.combinations(ranges, 2)
        if a[:2] != b[:2] and a[2].overlaps(b[2])
    ]
    assert not shared, shared
