"""Field paths and the issues (errors, warnings) found at them."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
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


# Problems of one severity an `Issues` keeps; beyond, it counts them. A config at the readers'
# bounds (cnidra.api.parameters) can hold tens of thousands of mistakes, and every reader (the
# CLI, the webhook's answer, kubelet's event) shows a few at best.
MAX_SHOWN = 100


@dataclass(frozen=True)
class Omitted(Issue):
    """Stands for `count` problems of one severity found but not kept; its path is the deepest
    one they all lie under."""

    count: int = 0


def omitted(path: FieldPath, count: int, severity: Severity) -> Omitted:
    what = "problem" if severity is Severity.ERROR else "warning"
    message = f"... and {count:,} more {what}{'' if count == 1 else 's'} not shown"
    return Omitted(path, message, severity, count)


class IssueList(list[Issue]):
    """The issues of one severity as they are shown: those kept, then one `Omitted` standing
    for the rest. `len()` is how many were reported, the omitted and the repeats included, so
    `before = len(issues.errors)` ... `len(issues.errors) > before` tells whether a check found
    a problem even when none of its own is kept."""

    def __init__(self, shown: Iterable[Issue], reported: int) -> None:
        super().__init__(shown)
        self.reported = reported

    def __len__(self) -> int:
        return self.reported


class Issues:
    """Collects the problems of one document; validation never stops at the first. The first
    `limit` errors and `limit` warnings are kept (each once: a repeat is counted, not kept
    again), the rest counted and shown as one `Omitted` line per severity, so what a judgement
    reports and keeps is bounded whatever the input."""

    def __init__(self, limit: int = MAX_SHOWN) -> None:
        self.limit = limit
        self._kept: list[Issue] = []
        self._seen: set[Issue] = set()
        self._shown = {Severity.ERROR: 0, Severity.WARNING: 0}
        self._reported = {Severity.ERROR: 0, Severity.WARNING: 0}
        self._omitted = {Severity.ERROR: 0, Severity.WARNING: 0}
        self._under: dict[Severity, tuple[Segment, ...]] = {}

    def error(self, path: FieldPath, message: str) -> None:
        self.add(Issue(path, message, Severity.ERROR))

    def warn(self, path: FieldPath, message: str) -> None:
        self.add(Issue(path, message, Severity.WARNING))

    def add(self, issue: Issue) -> None:
        severity = issue.severity
        if isinstance(issue, Omitted):  # another collection's count, carried over
            self._reported[severity] += issue.count
            self._omit(issue.path, severity, issue.count)
            return
        self._reported[severity] += 1
        if issue in self._seen:
            return
        if self._shown[severity] < self.limit:
            self._kept.append(issue)
            self._seen.add(issue)
            self._shown[severity] += 1
        else:
            self._omit(issue.path, severity, 1)

    def _omit(self, path: FieldPath, severity: Severity, count: int) -> None:
        self._omitted[severity] += count
        under = self._under.get(severity)
        if under is None:
            self._under[severity] = path.segments
            return
        n = 0
        for a, b in zip(under, path.segments, strict=False):
            if a != b or type(a) is not type(b):
                break
            n += 1
        if n < len(under):
            self._under[severity] = under[:n]

    def extend(self, other: Iterable[Issue]) -> None:
        for issue in other:
            self.add(issue)

    def _summary(self, severity: Severity) -> list[Issue]:
        count = self._omitted[severity]
        if not count:
            return []
        return [omitted(FieldPath(self._under.get(severity, ())), count, severity)]

    @property
    def items(self) -> list[Issue]:
        """Everything to show, in the order found: the kept issues, then a line per severity
        saying how many more there are. A new list: add with `error`, `warn`, `add`."""
        return [*self._kept, *self._summary(Severity.ERROR), *self._summary(Severity.WARNING)]

    @property
    def errors(self) -> IssueList:
        return self._of(Severity.ERROR)

    @property
    def warnings(self) -> IssueList:
        return self._of(Severity.WARNING)

    @property
    def error_count(self) -> int:
        """Errors reported, kept or not: grows with every one."""
        return self._reported[Severity.ERROR]

    @property
    def omitted(self) -> int:
        """Problems (errors and warnings) reported but not kept (a repeat of a kept one aside)."""
        return sum(self._omitted.values())

    def _of(self, severity: Severity) -> IssueList:
        shown = [i for i in self._kept if i.severity is severity]
        return IssueList([*shown, *self._summary(severity)], self._reported[severity])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Issues) and self.items == other.items

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Issues({self.items!r})"


def listing(names: Iterable[object], limit: int = 12) -> str:
    """Names for a message, at most `limit` of them: a message stays short however many there
    are ("a, b, c and 1,234 more")."""
    shown: list[str] = []
    more = 0
    for name in names:
        if len(shown) < limit:
            shown.append(str(name))
        else:
            more += 1
    return ", ".join(shown) + (f" and {more:,} more" if more else "")


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
