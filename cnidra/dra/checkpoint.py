"""The node's durable record of prepared claims: what NodePrepareResources resolved, for which
pods, so that the NRI hook needs nothing from the apiserver.

Write-through: every change is written (atomically, fsynced) before it is visible in memory,
one file per claim under <state>/claims/<uid>.json; a restart reloads them all."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cnidra.util.files import write_atomically

log = logging.getLogger(__name__)
VERSION = 1


@dataclass(frozen=True)
class PreparedDevice:
    """One allocated device of ours and the attachment it becomes in the pod."""

    request: str
    pool: str
    device: str
    if_name: str
    network: Mapping[str, Any]
    capability_args: Mapping[str, Any] = field(default_factory=dict)
    cni_args: tuple[tuple[str, str], ...] = ()
    share_id: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PreparedDevice:
        return cls(
            data["request"],
            data["pool"],
            data["device"],
            data["if_name"],
            data["network"],
            data.get("capability_args") or {},
            tuple((str(k), str(v)) for k, v in data.get("cni_args") or []),
            data.get("share_id"),
        )


@dataclass(frozen=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    pod_uids: tuple[str, ...]
    devices: tuple[PreparedDevice, ...]
    generation: int = 0

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["version"] = VERSION
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PreparedClaim:
        return cls(
            data["uid"],
            data["namespace"],
            data["name"],
            tuple(data["pod_uids"]),
            tuple(PreparedDevice.from_json(d) for d in data["devices"]),
            int(data.get("generation", 0)),
        )


class Checkpoint:
    def __init__(self, state_dir: str | Path) -> None:
        self.dir = Path(state_dir) / "claims"
        self._claims: dict[str, PreparedClaim] = {}
        self._lock = threading.Lock()
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._load()

    def _load(self) -> None:
        for path in sorted(self.dir.glob("*.json")):
            try:
                claim = PreparedClaim.from_json(json.loads(path.read_bytes()))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.error("checkpoint entry %s is unreadable, moved aside: %s", path, exc)
                path.rename(path.with_suffix(".corrupt"))
                continue
            self._claims[claim.uid] = claim

    def get(self, uid: str) -> PreparedClaim | None:
        return self._claims.get(uid)

    def put(self, claim: PreparedClaim) -> None:
        with self._lock:
            write_atomically(
                self.dir / f"{claim.uid}.json",
                json.dumps(claim.to_json(), separators=(",", ":")).encode(),
            )
            self._claims[claim.uid] = claim

    def remove(self, uid: str) -> bool:
        with self._lock:
            (self.dir / f"{uid}.json").unlink(missing_ok=True)
            return self._claims.pop(uid, None) is not None

    def for_pod(self, pod_uid: str) -> list[PreparedClaim]:
        """The pod's claims in a fixed order (namespace/name), so attach order is reproducible."""
        found = [c for c in self._claims.values() if pod_uid in c.pod_uids]
        return sorted(found, key=lambda c: (c.namespace, c.name))

    def all(self) -> Iterable[PreparedClaim]:
        return list(self._claims.values())

    def __len__(self) -> int:
        return len(self._claims)
