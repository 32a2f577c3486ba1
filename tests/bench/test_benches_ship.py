"""Benchmarks run the driver against what the chart ships: its CRDs are served before it starts.
Without them the driver measures its own 404 retries (the CNINetwork watch and the IPAM pass
every few seconds), which a cluster installed with the chart never sees."""

from __future__ import annotations

from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "bench"
STARTS_A_DRIVER = sorted(
    p for p in BENCH.glob("*.py") if "DriverProcess(" in p.read_text() and p.name != "__init__.py"
)


def test_some_benchmarks_start_the_driver() -> None:
    assert len(STARTS_A_DRIVER) >= 5


@pytest.mark.parametrize("path", STARTS_A_DRIVER, ids=lambda p: p.stem)
def test_a_benchmark_that_starts_the_driver_installs_the_chart_api(path: Path) -> None:
    assert "install_cnidra_api()" in path.read_text(), (
        f"bench/{path.name} starts the driver without the chart's CRDs: call "
        "Cluster.install_cnidra_api() first"
    )
