"""The driver's settings are declared once (cnidra/agent/settings.py): every field is a flag
and a CNIDRA_* variable with its default and help, what the CLI reads is the field, and the
chart's values schema and docs/settings.md's table are made from the fields
(hack/gen-settings.py)."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from cnidra.agent.settings import (
    DEFAULTS,
    SETTINGS,
    DriverSettings,
    LogSettings,
    chart_key,
    env_of,
    flag_of,
)
from cnidra.cli import main

ROOT = Path(__file__).parents[1]


seen_logs: list[LogSettings] = []


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[DriverSettings]:
    seen: list[DriverSettings] = []

    async def run(settings: DriverSettings) -> None:
        seen.append(settings)

    from cnidra.agent import driver

    monkeypatch.setattr(driver, "run", run)
    monkeypatch.setattr(main, "setup_logs", seen_logs.append)
    return seen


def invoke(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(main.app, ["driver", *args], env=env)


def test_every_field_is_a_flag_with_its_help_and_variable() -> None:
    text = invoke("--help", env={"COLUMNS": "300"}).output
    for f in [*dataclasses.fields(DriverSettings), *dataclasses.fields(LogSettings)]:
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


def test_choices_and_bounds_are_the_schemas(started: list[DriverSettings]) -> None:
    low = invoke("--node-name=n", "--max-attachments-per-pod=0")
    assert low.exit_code == 2 and "--max-attachments-per-pod 0: must be at least 1" in low.output
    index = invoke("--node-name=n", "--nri-plugin-index=5")
    assert index.exit_code == 2 and "--nri-plugin-index" in index.output
    level = invoke("--node-name=n", "--log-level=verbose")
    assert level.exit_code == 2 and "debug, info, warning, error" in level.output
    assert "Traceback" not in low.output + index.output + level.output
    assert started == []
    seen_logs.clear()
    ok = invoke("--node-name=n", "--link-failure-taint=noexecute", "--log-level=DEBUG")
    assert ok.exit_code == 0, ok.output
    assert started[0].link_failure_taint == "NoExecute"  # the declared spelling
    assert seen_logs == [LogSettings(log_level="debug")]


def test_the_webhook_takes_the_same_log_settings() -> None:
    text = CliRunner().invoke(main.app, ["webhook", "--help"], env={"COLUMNS": "300"}).output
    for flag in ("--log-level ", "--log-format", "--log-level-file", "--tls-cert"):
        assert flag in text


def generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_settings", ROOT / "hack" / "gen-settings.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_chart_schema_and_the_docs_table_are_made_from_the_fields() -> None:
    gen = generator()
    rerun = "differs from cnidra/agent/settings.py: run .venv/bin/python hack/gen-settings.py"
    assert gen.SCHEMA.read_text() == gen.schema_text(), f"values.schema.json {rerun}"
    assert gen.DOCS.read_text() == gen.docs_text(), f"docs/settings.md {rerun}"
    table = gen.DOCS.read_text()
    for cls in SETTINGS:
        for f in dataclasses.fields(cls):
            assert f"| `{flag_of(f)}` | `{env_of(f)}` |" in table, f.name


def test_every_chart_setting_is_a_value_and_reaches_the_driver() -> None:
    values = yaml.safe_load((ROOT / "charts" / "cnidra" / "values.yaml").read_text())["driver"]
    daemonset = (ROOT / "charts" / "cnidra" / "templates" / "daemonset.yaml").read_text()
    keys = [chart_key(f) for cls in SETTINGS for f in dataclasses.fields(cls) if chart_key(f)]
    assert set(values) == {*keys, "extraArgs"}
    for key in keys:
        assert re.search(rf"\$d\.{key}\b", daemonset), f"driver.{key} is not used by the DaemonSet"
