"""Installing the CNI plugins an image bundles onto the node (the chart's optional init step).
A node's own plugins win: a plugin already there with other content is kept unless the admin
asks to overwrite. Each file lands by rename, so a plugin that runs meanwhile is never torn."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from cnidra.util.files import write_atomically

PLUGIN_MODE = 0o755


@dataclass
class InstallReport:
    installed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # the node's own, different: not overwritten

    def __str__(self) -> str:
        parts = [f"installed {len(self.installed)}", f"up to date {len(self.unchanged)}"]
        if self.kept:
            parts.append(f"kept the node's own {', '.join(self.kept)} (--overwrite replaces them)")
        return "; ".join(parts)


def bundled_plugins(source: Path) -> list[Path]:
    return sorted(
        p for p in source.iterdir() if p.is_file() and os.access(p, os.X_OK) and p.name[0] != "."
    )


def install_plugins(source: Path, dest: Path, *, overwrite: bool = False) -> InstallReport:
    if not source.is_dir():
        raise FileNotFoundError(f"no bundled plugins at {source} (an image built with them?)")
    dest.mkdir(mode=0o755, parents=True, exist_ok=True)
    report = InstallReport()
    for plugin in bundled_plugins(source):
        target = dest / plugin.name
        data = plugin.read_bytes()
        if target.exists():
            if target.read_bytes() == data:
                report.unchanged.append(plugin.name)
                continue
            if not overwrite:
                report.kept.append(plugin.name)
                continue
        write_atomically(target, data, PLUGIN_MODE)
        report.installed.append(plugin.name)
    return report
