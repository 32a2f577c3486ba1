"""What cnidra did to each pod sandbox, on disk. Written before an ADD starts (state `adding`)
and before a DEL starts (`deleting`), so a crash at any point leaves a record that says what to
undo; one atomic file per sandbox under <state>/sandboxes/."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

from cnidra.cni.attach import Attachment
from cnidra.state.layout import StateLayout
from cnidra.state.store import JsonDirStore

log = logging.getLogger(__name__)


class State(StrEnum):
    ADDING = "adding"
    ADDED = "added"
    DELETING = "deleting"


@dataclass(frozen=True)
class AttachmentRecord:
    claim_uid: str
    claim_namespace: str
    claim_name: str
    request: str
    pool: str
    device: str
    if_name: str
    network: Mapping[str, Any]
    capability_args: Mapping[str, Any] = field(default_factory=dict)
    cni_args: tuple[tuple[str, str], ...] = ()
    share_id: str | None = None
    result: Mapping[str, Any] | None = None
    network_label: str = ""

    def attachment(self) -> Attachment:
        return Attachment(
            f"{self.claim_namespace}/{self.claim_name}",
            self.request,
            self.if_name,
            self.network,
            self.pool,
            self.device,
            self.capability_args,
            self.cni_args,
            self.share_id,
            self.network_label,
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AttachmentRecord:
        return cls(
            **{
                **data,
                "cni_args": tuple(tuple(p) for p in data.get("cni_args") or []),
                "network_label": data.get("network_label") or data["network"].get("name", ""),
            }
        )


@dataclass(frozen=True)
class SandboxRecord:
    sandbox_id: str
    pod_uid: str
    pod_namespace: str
    pod_name: str
    netns: str
    state: State
    attachments: tuple[AttachmentRecord, ...]

    def with_state(self, state: State, **changes: Any) -> SandboxRecord:
        return replace(self, state=state, **changes)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SandboxRecord:
        return cls(
            data["sandbox_id"],
            data["pod_uid"],
            data["pod_namespace"],
            data["pod_name"],
            data["netns"],
            State(data["state"]),
            tuple(AttachmentRecord.from_json(a) for a in data["attachments"]),
        )


class SandboxStore(JsonDirStore[SandboxRecord]):
    """Sandbox records by sandbox ID, one file each under <state>/sandboxes."""

    def __init__(self, layout: StateLayout) -> None:
        super().__init__(
            layout.sandboxes,
            SandboxRecord.from_json,
            SandboxRecord.to_json,
            lambda record: record.sandbox_id,
        )
