"""The driver's settings are declared once (cnidra/agent/settings.py): every field is a flag
and a CNIDRA_* variable with its default and help, and what the CLI reads is the field."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cnidra.agent.settings import DEFAULTS, DriverSettings
from cnidra.cli import main


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[DriverSettings]:
    seen: list[DriverSettings] = []

    async def run(settings: DriverSettings) -> None:
        seen.append(settings)

    from cnidra.agent import driver

    monkeypatch.setattr(driver, "run", run)
    monkeypatch.setattr(main, "setup_logs", lambda level, fmt: None)
    return seen


def invoke(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(main.app, ["driver", *args], env=env)


def test_every_field_is_a_flag_with_its_help_and_variable() -> None:
    text = invoke("--help", env={"COLUMNS": "300"}).output
    for f in dataclasses.fields(DriverSettings):
        flag = str(f.metadata.get("flag") or "--" + f.name.replace("_", "-")).split("/")[0]
        assert flag in text, f.name
        assert f.metadata.get("help"), f"{f.name} has no help"


def test_defaults_come_from_the_fields(started: list[DriverSettings]) -> None:
    result = invoke("--node-name", "n1")
    assert result.exit_code == 0, result.output
    assert started == [dataclasses.replace(DEFAULTS, node_name="n1")]


def test_flags_and_variables_reach_the_fields(started: list[DriverSettings]) -> None:
    result = invoke(
        "--node-name=n1",
        "--cni-path=/a:/b:",
        "--publish-node-links=eth0,eth1",
        "--exclude-interfaces=",
        "--max-attachments-per-pod=3",
        "--attach-in-sandbox-hook",
        "--no-network-status",
        env={"CNIDRA_SUB_INTERFACES": "7", "CNIDRA_STATE_DIR": "/tmp/s"},
    )
    assert result.exit_code == 0, result.output
    [got] = started
    assert got.cni_path == ["/a", "/b"]
    assert got.publish_node_links == ["eth0", "eth1"]
    assert got.exclude_interfaces == DEFAULTS.exclude_interfaces  # "": the built-in list
    assert (got.max_attachments, got.sub_interfaces, got.state_dir) == (3, 7, Path("/tmp/s"))
    assert not got.attach_behind_sandbox and not got.network_status


def test_a_missing_node_name_or_a_wrong_type_is_named(started: list[DriverSettings]) -> None:
    missing = invoke()
    assert missing.exit_code == 2 and "--node-name" in missing.output
    wrong = invoke("--node-name=n", "--sub-interfaces=many")
    assert wrong.exit_code == 2 and "--sub-interfaces" in wrong.output
    assert started == []
