"""JSON logs: one object per line with the fields log pipelines index; a bad format is named."""

from __future__ import annotations

import json
import logging

import pytest

from cnidra.observe.logs import configure


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
