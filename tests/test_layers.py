"""The import graph matches docs/architecture.md: a package imports only packages of lower
layers (and itself); packages of one layer do not import each other."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "cnidra"

# lowest first; the same list is drawn in docs/architecture.md
LAYERS: list[set[str]] = [
    {"api", "util", "_proto"},
    {"cni", "observe", "datapath"},
    {"state", "kube"},
    {"status", "inventory", "ipam"},
    {"dra", "nri", "admission", "nodeapi"},
    {"agent"},
    {"cli"},
]
LAYER = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}


def imports(path: Path) -> set[str]:
    """The cnidra packages a module imports (at any depth, lazily or not)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "cnidra" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_every_package_has_a_layer() -> None:
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(LAYER), "add the package to LAYERS and to docs/architecture.md"


def test_no_import_runs_upward_or_sideways() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = path.relative_to(PACKAGE).parts[0]
        if own not in LAYER:  # cnidra/__main__.py, cnidra/__init__.py
            continue
        for target in imports(path) - {own}:
            if LAYER[target] >= LAYER[own]:
                wrong.append(f"{path.relative_to(PACKAGE.parent)} imports cnidra.{target}")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)
