"""`cnidra install-cni-plugins`, the chart's optional init step, with the real reference
plugins: installs what the node lacks, leaves identical files alone, keeps the node's own
different plugins unless told to overwrite, and every file lands whole and executable."""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys
from pathlib import Path

from cnidra.cni.install import install_plugins
from tests.conftest import CNITools


def bundle(cni_tools: CNITools, tmp_path: Path, names: tuple[str, ...]) -> Path:
    source = tmp_path / "bundled"
    source.mkdir()
    for name in names:
        shutil.copy2(Path(cni_tools.plugins) / name, source / name)
    return source


def test_installs_what_is_missing_and_keeps_the_nodes_own(
    cni_tools: CNITools, tmp_path: Path
) -> None:
    source = bundle(cni_tools, tmp_path, ("macvlan", "host-local", "tuning"))
    dest = tmp_path / "opt-cni-bin"
    dest.mkdir()
    shutil.copy2(source / "host-local", dest / "host-local")  # the same as the bundle's
    (dest / "tuning").write_bytes(b"#!/bin/sh\n# the node's own build\n")

    report = install_plugins(source, dest)
    assert (report.installed, report.unchanged, report.kept) == (
        ["macvlan"],
        ["host-local"],
        ["tuning"],
    )
    assert (dest / "macvlan").read_bytes() == (source / "macvlan").read_bytes()
    assert stat.S_IMODE((dest / "macvlan").stat().st_mode) == 0o755
    assert b"node's own" in (dest / "tuning").read_bytes()
    version = subprocess.run(
        [dest / "macvlan"], env={"CNI_COMMAND": "VERSION"}, capture_output=True, text=True,
        check=True, timeout=30,
    )  # fmt: skip
    assert "supportedVersions" in version.stdout  # a working plugin, not a torn copy
    assert not [p for p in dest.iterdir() if p.name.startswith(".")]  # no temp files left

    again = install_plugins(source, dest, overwrite=True)
    assert again.installed == ["tuning"] and again.kept == []
    assert (dest / "tuning").read_bytes() == (source / "tuning").read_bytes()


def test_the_command_names_a_missing_bundle(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cnidra", "install-cni-plugins", "--source", str(tmp_path / "x"),
         "--dest", str(tmp_path / "d")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2 and "no bundled plugins at" in out.stderr
