"""Field paths and the issues (errors, warnings) found at them."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

Segment = str | int
_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_\-/]+$")


@dataclass(frozen=True)
class FieldPath:
    """A location in a document: `spec.devices.config[0].opaque.parameters`."""

    segments: tuple[Segment, ...] = ()

    def __truediv__(self, segment: Segment) -> FieldPath:
        return FieldPath((*self.segments, segment))

    def join(self, segments: Iterable[Segment]) -> FieldPath:
        return FieldPath((*self.segments, *segments))

    def __str__(self) -> str:
        out: list[str] = []
        for seg in self.segments:
            if isinstance(seg, int):
                out.append(f"[{seg}]")
            elif _PLAIN_KEY.match(seg):
                out.append(f".{seg}" if out else seg)
            else:
                out.append(f'["{seg}"]')
        return "".join(out) or "<document>"


ROOT = FieldPath()


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True)
class Issue:
    path: FieldPath
    message: str
    severity: Severity = Severity.ERROR

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


@dataclass
class Issues:
    """Collects every problem of one document; validation never stops at the first."""

    items: list[Issue] = field(default_factory=list)

    def error(self, path: FieldPath, message: str) -> None:
        self.items.append(Issue(path, message, Severity.ERROR))

    def warn(self, path: FieldPath, message: str) -> None:
        self.items.append(Issue(path, message, Severity.WARNING))

    def extend(self, other: Iterable[Issue]) -> None:
        self.items.extend(other)

    @property
    def errors(self) -> list[Issue]:
        return [i for i in self.items if i.severity is Severity.ERROR]

    @property
    def warnings(self) -> list[Issue]:
        return [i for i in self.items if i.severity is Severity.WARNING]


def describe(value: object) -> str:
    """How a value appears in a message: its JSON type and a short rendering."""
    kind = json_type(value)
    if isinstance(value, dict | list):
        return kind
    text = repr(value) if isinstance(value, str) else str(value).lower()
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{kind} {text}"


def json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__
