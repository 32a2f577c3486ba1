"""docs/metrics.md lists every series the driver exports."""

from __future__ import annotations

from pathlib import Path

from cnidra.observe.metrics import REGISTRY

DOC = Path(__file__).parents[2] / "docs" / "metrics.md"


def test_every_series_is_documented() -> None:
    text = DOC.read_text()
    names = set()
    for family in REGISTRY.collect():
        suffix = {"counter": "_total", "info": "_info"}.get(family.type, "")
        names.add(family.name + suffix)
    missing = sorted(n for n in names if f"`{n}`" not in text)
    assert missing == [], f"add to docs/metrics.md: {missing}"
