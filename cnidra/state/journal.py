"""What happened to pods' networks on this node, newest last: attach, attach failure, detach,
detach failure, late attach, sweep. Kept on disk (one JSON line each, bounded) so an operator
reads the same story after a driver restart and with the apiserver down; the node API streams
new entries to watchers. Appending is a small local write, cheap enough for the hook path."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cnidra.api.refs import ObjectRef
from cnidra.state.store import compact_json

log = logging.getLogger(__name__)

ATTACHED = "Attached"
ATTACH_FAILED = "AttachFailed"
DETACHED = "Detached"
DETACH_FAILED = "DetachFailed"
SWEPT = "Swept"


@dataclass(frozen=True, slots=True)  # 2,000 of them kept: no __dict__ each
class Entry:
    seq: int
    time: float
    kind: str
    pod_namespace: str
    pod_name: str
    pod_uid: str
    sandbox_id: str
    message: str
    duration_ms: float = 0.0
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def pod(self) -> ObjectRef:
        return ObjectRef(self.pod_namespace, self.pod_name, self.pod_uid)

    def to_json(self) -> dict[str, Any]:
        """What dataclasses.asdict gave, built directly (asdict walks every field and the
        details recursively: 30 times the time, twice a pod on the hook path); the details are
        JSON values (the journal's lines), copied one level as asdict copied them."""
        return {
            "seq": self.seq,
            "time": self.time,
            "kind": self.kind,
            "pod_namespace": self.pod_namespace,
            "pod_name": self.pod_name,
            "pod_uid": self.pod_uid,
            "sandbox_id": self.sandbox_id,
            "message": self.message,
            "duration_ms": self.duration_ms,
            "details": dict(self.details),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Entry:
        return cls(
            int(data["seq"]),
            float(data["time"]),
            str(data["kind"]),
            str(data["pod_namespace"]),
            str(data["pod_name"]),
            str(data["pod_uid"]),
            str(data.get("sandbox_id", "")),
            str(data.get("message", "")),
            float(data.get("duration_ms", 0.0)),
            dict(data.get("details") or {}),
        )


class Journal:
    """The last `keep` entries, in memory and in `path`; rewritten to `keep` lines when the
    file has grown to twice that."""

    def __init__(self, path: Path | None, keep: int = 2000) -> None:
        self.path = path
        self.keep = keep
        self.entries: deque[Entry] = deque(maxlen=keep)
        self.watchers: set[asyncio.Queue[Entry]] = set()
        self._lines = 0
        if path is not None and path.exists():
            self._load(path)
        self.seq = self.entries[-1].seq if self.entries else 0

    def _load(self, path: Path) -> None:
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                self.entries.append(Entry.from_json(json.loads(line)))
            self._lines += 1

    def record(
        self,
        kind: str,
        pod: ObjectRef,
        sandbox_id: str,
        message: str,
        duration_ms: float = 0.0,
        **details: Any,
    ) -> Entry:
        self.seq += 1
        entry = Entry(
            self.seq,
            time.time(),
            kind,
            pod.namespace,
            pod.name,
            pod.uid,
            sandbox_id,
            message,
            round(duration_ms, 3),
            details,
        )
        self.entries.append(entry)
        self._append(entry)
        for queue in list(self.watchers):
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(entry)
        return entry

    def _append(self, entry: Entry) -> None:
        if self.path is None:
            return
        try:
            if self._lines >= 2 * self.keep:
                self._rewrite()
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(compact_json(entry.to_json()) + "\n")
            self._lines += 1
        except OSError as exc:  # the journal informs; it never fails a pod
            log.warning("journal %s: %s", self.path, exc)

    def _rewrite(self) -> None:
        assert self.path is not None
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for entry in self.entries:
                f.write(compact_json(entry.to_json()) + "\n")
        os.replace(tmp, self.path)
        self._lines = len(self.entries)

    def for_pod(self, pod_uid: str) -> list[Entry]:
        return [e for e in self.entries if e.pod_uid == pod_uid]

    def since(self, seq: int) -> Iterator[Entry]:
        return (e for e in self.entries if e.seq > seq)

    @contextlib.contextmanager
    def watch(self, size: int = 1000) -> Iterator[asyncio.Queue[Entry]]:
        queue: asyncio.Queue[Entry] = asyncio.Queue(size)
        self.watchers.add(queue)
        try:
            yield queue
        finally:
            self.watchers.discard(queue)
