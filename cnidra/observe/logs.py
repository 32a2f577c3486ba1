"""Log output: text for people, or one JSON object per line for Loki and friends (`ts`,
`level`, `logger`, `msg`, `pod`, `claim` and `sandbox` when the line concerns them, and `exc`
with the traceback when there is one). One place sets it up for every long-running command.

The pod, claim and sandbox a line concerns come from `fields(...)`, set where the work for one
of them starts (an NRI hook, a claim's prepare): every line logged under it, in tasks started
under it too (asyncio copies the context), carries them, in text as `pod=ns/name` after the
message. A `level_file` (the chart's ConfigMap) is looked at every few seconds, so an operator
changes the level without a restart."""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")
FIELDS = ("pod", "claim", "sandbox")
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LEVEL_FILE_SECONDS = 5.0

_fields: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "log_fields", default=None
)
log = logging.getLogger(__name__)


@contextlib.contextmanager
def fields(**values: str) -> Iterator[None]:
    """Lines logged inside (and in tasks started inside) carry these fields (pod, claim,
    sandbox); empty values are left out."""
    token = _fields.set({**(_fields.get() or {}), **{k: v for k, v in values.items() if v}})
    try:
        yield
    finally:
        _fields.reset(token)


def current_fields() -> dict[str, str]:
    return dict(_fields.get() or {})


class ContextFilter(logging.Filter):
    """Puts the context's fields on each record (a field given with `extra=` wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in (_fields.get() or {}).items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


def _record_fields(record: logging.LogRecord) -> dict[str, str]:
    return {k: str(getattr(record, k)) for k in FIELDS if getattr(record, k, None)}


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(TEXT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = " ".join(f"{k}={v}" for k, v in _record_fields(record).items())
        if not extra:
            return line
        head, newline, rest = line.partition("\n")  # after the message, before a traceback
        return f"{head} {extra}{newline}{rest}"


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_record_fields(record),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def parse_level(text: str) -> str:
    level = text.strip().lower()
    if level == "warn":
        level = "warning"
    if level not in LEVELS:
        raise ValueError(f"log level {text.strip()!r}: allowed: {', '.join(LEVELS)}")
    return level


def set_level(level: str) -> None:
    logging.getLogger().setLevel(parse_level(level).upper())


class LevelFile:
    """Follows the level written in a file: a missing, empty or wrong file leaves the level
    as it is (a wrong one is said once)."""

    def __init__(self, path: Path, level: str) -> None:
        self.path = path
        self.level = level
        self._said = ""

    def poll(self) -> None:
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace")[:64].strip()
        except OSError:
            return
        if not text or text.lower() == self.level:
            return
        try:
            level = parse_level(text)
        except ValueError as exc:
            if str(exc) != self._said:
                self._said = str(exc)
                log.warning("%s (in %s); the level stays %s", exc, self.path, self.level)
            return
        if level != self.level:
            log.warning("log level %s (was %s), from %s", level, self.level, self.path)
            set_level(level)
            self.level = level
        self._said = ""

    def follow(self, stop: threading.Event, seconds: float = LEVEL_FILE_SECONDS) -> None:
        while not stop.wait(seconds):
            self.poll()


_follower: tuple[threading.Event, threading.Thread] | None = None


def configure(level: str, fmt: str = "text", level_file: str | Path | None = None) -> None:
    """Root logging at `level` in `fmt` (text or json); chatty client libraries quieter; with
    `level_file`, the level follows that file's content (read now and every few seconds)."""
    global _follower  # noqa: PLW0603 (one level file per process, as one root logger)
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: allowed: {', '.join(FORMATS)}")
    level = parse_level(level)
    handler = logging.StreamHandler()
    handler.setFormatter(JSONFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    if _follower is not None:
        _follower[0].set()
        _follower = None
    if level_file:
        follower = LevelFile(Path(level_file), level)
        follower.poll()
        stop = threading.Event()
        thread = threading.Thread(
            target=follower.follow, args=(stop,), name="log-level-file", daemon=True
        )
        thread.start()
        _follower = (stop, thread)
