"""How DeviceClass and claim configs combine for one request, the way DRA orders them.

DRA hands a driver the configs that apply to a request in a fixed order: those of the
DeviceClass first, then those of the claim, each in the order written; a claim config applies
to a request when its `requests` list is empty or names the request (or, for a subrequest
`main/sub`, its parent `main`). cnidra folds them in that order, later over earlier:
top-level CNIConfig fields replace earlier ones, `args` and `capabilities` merge key by key,
and `config` merges as a JSON merge patch (RFC 7386): objects merge, lists and scalars are
replaced, `null` removes a key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from cnidra.api.issues import FieldPath

_KEYWISE = ("args", "capabilities")


class Source(StrEnum):
    CLASS = "FromClass"
    CLAIM = "FromClaim"


@dataclass(frozen=True)
class ConfigEntry:
    """One opaque config of our driver, with where it came from."""

    source: Source
    parameters: Mapping[str, Any]
    requests: tuple[str, ...] = ()
    path: FieldPath = field(default_factory=FieldPath)

    def applies_to(self, request: str) -> bool:
        if not self.requests:
            return True
        parent = request.split("/", 1)[0]
        return request in self.requests or parent in self.requests


def applicable(entries: Iterable[ConfigEntry], request: str) -> list[ConfigEntry]:
    """The entries for `request`, class configs first, each group in its written order."""
    matching = [e for e in entries if e.applies_to(request)]
    return [e for e in matching if e.source is Source.CLASS] + [
        e for e in matching if e.source is Source.CLAIM
    ]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch; returns a new value and never mutates its inputs."""
    if not isinstance(patch, Mapping):
        return patch
    result: dict[str, Any] = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def merge_parameters(entries: Sequence[ConfigEntry]) -> dict[str, Any]:
    """Fold the parameters of `entries` (already in DRA order) into one."""
    merged: dict[str, Any] = {}
    for entry in entries:
        for key, value in entry.parameters.items():
            if key == "config":
                merged[key] = merge_patch(merged.get(key), value)
            elif (
                key in _KEYWISE
                and isinstance(value, Mapping)
                and isinstance(merged.get(key), Mapping)
            ):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
    return merged


def last_set(entries: Sequence[ConfigEntry], key: str) -> Any:
    """The value the last of `entries` to have `key` gives it (None: none has it), without
    merging anything. For a key the merge replaces whole (not `config`, `args`,
    `capabilities`) it is `merge_parameters(entries).get(key)`; for any key it is None exactly
    when that is (a merge patch of null removes, anything else sets)."""
    for entry in reversed(entries):
        if key in entry.parameters:
            return entry.parameters[key]
    return None


def provenance(entries: Sequence[ConfigEntry], key: str) -> FieldPath | None:
    """Path of the last entry that set `key`: where a problem with that field should point."""
    for entry in reversed(entries):
        if key in entry.parameters:
            return entry.path / key
    return None
