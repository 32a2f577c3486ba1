"""JSON logs: one object per line with the fields log pipelines index (pod, claim and sandbox
where a line concerns them); the level follows a file without a restart; bad values are named."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from cnidra.observe.logs import LevelFile, configure, fields


def test_json_lines_carry_level_logger_message_and_traceback(
    capfd: pytest.CaptureFixture[str],
) -> None:
    configure("info", "json")
    log = logging.getLogger("cnidra.test")
    log.info("attached %s", "net1")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("failed")
    first, second = (json.loads(line) for line in capfd.readouterr().err.splitlines())
    assert (first["level"], first["logger"], first["msg"]) == (
        "info",
        "cnidra.test",
        "attached net1",
    )
    assert first["ts"].endswith("Z") and second["level"] == "error" and "boom" in second["exc"]
    configure("info", "text")


def test_a_bad_format_is_named() -> None:
    with pytest.raises(ValueError, match="allowed: text, json"):
        configure("info", "xml")


def test_the_pod_claim_and_sandbox_a_line_concerns_are_fields(
    capfd: pytest.CaptureFixture[str],
) -> None:
    log = logging.getLogger("cnidra.test")
    configure("info", "json")
    with fields(pod="team-a/app", sandbox="5f0c2e9a1b7d"):
        log.info("attached")
        with fields(claim="team-a/net"):
            log.warning("prepared")
    log.info("nothing", extra={"claim": "team-a/other"})
    lines = [json.loads(line) for line in capfd.readouterr().err.splitlines()]
    assert [{k: e.get(k) for k in ("pod", "claim", "sandbox")} for e in lines] == [
        {"pod": "team-a/app", "claim": None, "sandbox": "5f0c2e9a1b7d"},
        {"pod": "team-a/app", "claim": "team-a/net", "sandbox": "5f0c2e9a1b7d"},
        {"pod": None, "claim": "team-a/other", "sandbox": None},
    ]
    configure("info", "text")
    with fields(pod="team-a/app"):
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.exception("failed")
    first, *rest = capfd.readouterr().err.splitlines()
    assert first.endswith("cnidra.test: failed pod=team-a/app") and "boom" in rest[-1]


async def test_fields_follow_tasks_started_under_them(capfd: pytest.CaptureFixture[str]) -> None:
    configure("info", "json")

    async def background() -> None:
        logging.getLogger("cnidra.test").info("in a task")

    with fields(pod="ns/p"):
        task = asyncio.create_task(background())
    await task
    assert json.loads(capfd.readouterr().err)["pod"] == "ns/p"
    configure("info", "text")


def test_the_level_follows_its_file_without_a_restart(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    level = tmp_path / "level"
    level.write_text("warning\n")
    configure("info", "text", level)  # read at start: the file wins over --log-level
    root = logging.getLogger()
    assert root.level == logging.WARNING
    level = tmp_path / "followed"  # not the file configure's thread reads: no race with it
    follower = LevelFile(level, "warning")
    level.write_text("debug")
    follower.poll()
    assert root.level == logging.DEBUG
    level.write_text("verbose")
    follower.poll()
    follower.poll()
    assert root.level == logging.DEBUG
    assert capfd.readouterr().err.count("log level 'verbose': allowed: debug") == 1  # said once
    level.unlink()
    follower.poll()  # a missing file (a ConfigMap being swapped) changes nothing
    assert root.level == logging.DEBUG
    configure("info", "text")
    assert root.level == logging.INFO


def test_a_bad_level_is_named() -> None:
    with pytest.raises(ValueError, match="allowed: debug, info, warning, error"):
        configure("loud", "text")
