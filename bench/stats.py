"""Percentiles and their summary, for every benchmark (no imports: bench.prepare_inproc's driver
process measures its RSS with what the driver loads alone)."""

from __future__ import annotations


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(pct(values, 0.5), 2),
        "p99": round(pct(values, 0.99), 2),
        "max": round(max(values), 2),
        "n": len(values),
    }
