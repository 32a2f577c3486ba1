"""Interface names in a pod: one rule, applied by `cnidra validate`, prepare and the NRI hook.
Pure.

Each interface is named in one of three ways (DANM's, mixable in one pod):

- **explicit**: `ifName: data0`, from the claim, its class or the network;
- **prefix**: `ifNamePrefix: data` (a CNIConfig's, or a CNINetwork's): the prefix and the lowest
  index from 0 not yet taken in the pod, in connection order (`data0`, `data1`, ...);
- **implicit**: neither: `net1`, `net2`, ... the lowest free number from 1, in connection order
  (Multus' names for unnamed networks).

Connection order is the pod's `spec.resourceClaims` order (kubelet prepares a pod's claims in
that order), then each claim's `spec.devices.requests` order. Explicit names are placed first,
so a later claim's explicit `net1` moves an earlier implicit name to `net2`, never the reverse.

Names are unique in the pod across all claims; `eth0` (the primary network's) and `lo` are
never cnidra's; a name is at most 15 bytes of letters, digits, '-', '_' and '.'.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cnidra.api.constants import IFNAME_MAX_BYTES, PRIMARY_IFNAME

IMPLICIT_PREFIX = "net"
RESERVED = frozenset({PRIMARY_IFNAME, "lo"})
PREFIX_MAX = 12  # leaves room for an index up to 999
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True)
class Slot:
    """One interface to name: who wants it (for messages) and how it is named."""

    owner: str  # e.g. "claim team-a/pod-data request data"
    explicit: str | None = None
    prefix: str | None = None
    # the name it had before (a claim prepared again): kept while the rule still gives it
    preferred: str | None = None


class NamingError(ValueError):
    """Every collision at once: `problems` pairs a slot's index with what is wrong."""

    def __init__(self, problems: list[tuple[int, str]]) -> None:
        super().__init__("; ".join(message for _, message in problems))
        self.problems = problems


def prefix_problem(prefix: str) -> str | None:
    if not prefix or len(prefix) > PREFIX_MAX or not _NAME.match(prefix):
        return (
            f"{prefix!r} is not an interface name prefix: 1 to {PREFIX_MAX} letters, digits, "
            "'-', '_' or '.'"
        )
    return None


def assign_names(slots: Sequence[Slot], taken: Mapping[str, str] | None = None) -> list[str]:
    """The name of each slot, in order; `taken` maps names already in the pod (its other claims,
    prepared before) to their owner. NamingError says every collision at once."""
    used: dict[str, str] = dict(taken or {})
    problems: list[tuple[int, str]] = []
    names: list[str | None] = [None] * len(slots)
    for i, slot in enumerate(slots):
        if slot.explicit is None:
            continue
        name = slot.explicit
        if name in RESERVED:
            problems.append(
                (i, f"{slot.owner}: interface name {name!r} is the pod's own, not cnidra's")
            )
        elif name in used:
            problems.append(
                (
                    i,
                    f"{slot.owner}: interface name {name!r} is already used by {used[name]}; "
                    "every interface in the pod needs its own name",
                )
            )
        else:
            used[name] = slot.owner
        names[i] = name
    for i, slot in enumerate(slots):
        if slot.explicit is not None:
            continue
        prefix = slot.prefix or IMPLICIT_PREFIX
        index = 0 if slot.prefix else 1
        kept = slot.preferred
        if kept and kept not in used and kept.startswith(prefix) and kept[len(prefix) :].isdigit():
            used[kept] = slot.owner
            names[i] = kept
            continue
        while f"{prefix}{index}" in used or f"{prefix}{index}" in RESERVED:
            index += 1
        name = f"{prefix}{index}"
        if len(name.encode()) > IFNAME_MAX_BYTES:
            problems.append((i, f"{slot.owner}: interface name {name!r} is longer than 15 bytes"))
        used[name] = slot.owner
        names[i] = name
    if problems:
        raise NamingError(problems)
    return [n or "" for n in names]


def check_unique(names: Sequence[tuple[str, str]]) -> None:
    """The hook's check over a pod's prepared attachments: (owner, name) pairs."""
    assign_names([Slot(owner, explicit=name) for owner, name in names])
