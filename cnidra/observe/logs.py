"""Log output: text for people, or one JSON object per line for Loki and friends (`ts`,
`level`, `logger`, `msg`, and `exc` with the traceback when there is one). One place sets it up
for every long-running command."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

FORMATS = ("text", "json")
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(level: str, fmt: str = "text") -> None:
    """Root logging at `level` in `fmt` (text or json); chatty client libraries quieter."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: allowed: {', '.join(FORMATS)}")
    handler = logging.StreamHandler()
    handler.setFormatter(JSONFormatter() if fmt == "json" else logging.Formatter(TEXT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # one line per request otherwise
