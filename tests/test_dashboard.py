"""The Grafana dashboard the chart ships is hack/gen-dashboard.py's output, and its queries
name only series the driver exports (docs/metrics.md)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
BOARD = ROOT / "charts" / "cnidra" / "dashboards" / "cnidra.json"


def test_the_dashboard_is_the_generators_output() -> None:
    check = subprocess.run(
        [sys.executable, ROOT / "hack" / "gen-dashboard.py", "--check"], timeout=60, check=False
    )
    assert check.returncode == 0, "run hack/gen-dashboard.py"


def test_every_query_names_documented_series() -> None:
    documented = set(re.findall(r"`(cnidra_[a-z_]+)`", (ROOT / "docs" / "metrics.md").read_text()))
    board = json.loads(BOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    used = {name for e in exprs for name in re.findall(r"\bcnidra_[a-z_]+", e)}
    unknown = {
        n
        for n in used
        if n not in documented and re.sub(r"_(bucket|count|sum)$", "", n) not in documented
    }
    assert not unknown, unknown
