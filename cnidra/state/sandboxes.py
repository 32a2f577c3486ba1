"""What cnidra did to each pod sandbox, on disk. Written before an ADD starts (state `adding`)
and before a DEL starts (`deleting`), so a crash at any point leaves a record that says what to
undo; one atomic file per sandbox under <state>/sandboxes/. These records, and nothing else,
are cnidra's proof that it added an interface (docs/state.md)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from cnidra.api.refs import ObjectRef
from cnidra.cni.attach import Attachment
from cnidra.state.checkpoint import attachment_from_json, attachment_to_json
from cnidra.state.layout import StateLayout
from cnidra.state.store import JsonDirStore, compact_json

log = logging.getLogger(__name__)


class State(StrEnum):
    ADDING = "adding"
    ADDED = "added"
    DELETING = "deleting"


@dataclass(frozen=True)
class Attached:
    """An attachment of a sandbox and, once ADD succeeded, its CNI result. `pending` in an
    `added` record: an on-demand attachment being plugged or unplugged; a crash leaves it for
    the next Synchronize to DEL and drop (the record's other attachments stay)."""

    attachment: Attachment
    result: Mapping[str, Any] | None = None
    pending: bool = False

    def to_json(self) -> dict[str, Any]:
        claim = self.attachment.claim
        return {
            "claim_uid": claim.uid,
            "claim_namespace": claim.namespace,
            "claim_name": claim.name,
            **attachment_to_json(self.attachment),
            "result": self.result,
            "pending": self.pending,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Attached:
        claim = ObjectRef(data["claim_namespace"], data["claim_name"], data["claim_uid"])
        return cls(attachment_from_json(data, claim), data.get("result"), bool(data.get("pending")))


@dataclass(frozen=True)
class SandboxRecord:
    sandbox_id: str
    pod: ObjectRef
    netns: str
    state: State
    attachments: tuple[Attached, ...]

    def with_state(self, state: State, **changes: Any) -> SandboxRecord:
        return replace(self, state=state, **changes)

    def claims(self) -> set[ObjectRef]:
        return {a.attachment.claim for a in self.attachments}

    def to_json(self) -> dict[str, Any]:
        return {
            "sandbox_id": self.sandbox_id,
            "pod_uid": self.pod.uid,
            "pod_namespace": self.pod.namespace,
            "pod_name": self.pod.name,
            "netns": self.netns,
            "state": str(self.state),
            "attachments": [a.to_json() for a in self.attachments],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SandboxRecord:
        return cls(
            data["sandbox_id"],
            ObjectRef(data["pod_namespace"], data["pod_name"], data["pod_uid"]),
            data["netns"],
            State(data["state"]),
            tuple(Attached.from_json(a) for a in data["attachments"]),
        )


class SandboxStore(JsonDirStore[SandboxRecord]):
    """Sandbox records by sandbox ID, one file each under <state>/sandboxes."""

    def __init__(self, layout: StateLayout) -> None:
        super().__init__(
            layout.sandboxes,
            SandboxRecord.from_json,
            SandboxRecord.to_json,
            lambda record: record.sandbox_id,
            # a record guards against the driver dying mid-ADD, which keeps what the page cache
            # holds; a machine crash ends every sandbox it describes, and GC at start frees
            # what their plugins held: an fsync would only lengthen every hook (NRI runs the
            # hooks of all pods one at a time)
            durable=False,
            dumps=head_first,
        )


def head_first(data: Mapping[str, Any]) -> str:
    """A record as compact JSON with its head (every field but `attachments`, none of which a
    tenant writes) alone on the first line: the container gate reads that line and no more."""
    head = {k: v for k, v in data.items() if k != "attachments"}
    text = compact_json(head)
    if "attachments" not in data:
        return text
    rest = compact_json({"attachments": data["attachments"]})
    return f"{text[:-1]},\n{rest[1:]}" if head else rest
