"""The result cache, in libcni's on-disk format, so that DEL works after a restart and other
tools (cnitool, containerd's CNI) can read what cnidra wrote and the other way round."""

from __future__ import annotations

import base64
import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cnidra.cni.errors import CacheError
from cnidra.cni.result import Result
from cnidra.cni.types import RuntimeConf
from cnidra.util.files import write_atomically

CACHE_KIND = "cniCacheV1"
DEFAULT_CACHE_DIR = "/var/lib/cni"


@dataclass(frozen=True)
class CachedAttachment:
    network: str
    container_id: str
    if_name: str
    netns: str
    config: bytes
    cni_args: tuple[tuple[str, str], ...] = ()
    capability_args: dict[str, Any] = field(default_factory=dict)
    result: dict[str, Any] | None = None

    def runtime_conf(self) -> RuntimeConf:
        return RuntimeConf(
            self.container_id, self.netns, self.if_name, self.cni_args, self.capability_args
        )


class ResultCache:
    def __init__(self, cache_dir: str | os.PathLike[str] = DEFAULT_CACHE_DIR) -> None:
        self.dir = Path(cache_dir) / "results"

    def path(self, network: str, rt: RuntimeConf) -> Path:
        if not (network and rt.container_id and rt.if_name):
            raise CacheError("a cache entry needs a network name, a container id and an ifName")
        return self.dir / f"{network}-{rt.container_id}-{rt.if_name}"

    def store(self, network: str, rt: RuntimeConf, config: bytes, result: Result) -> None:
        entry: dict[str, Any] = {
            "kind": CACHE_KIND,
            "containerId": rt.container_id,
            "config": base64.b64encode(config).decode(),
            "ifName": rt.if_name,
            "networkName": network,
        }
        if rt.netns:
            entry["netns"] = rt.netns
        if rt.args:
            entry["cniArgs"] = [list(pair) for pair in rt.args]
        if rt.capability_args:
            entry["capabilityArgs"] = dict(rt.capability_args)
        entry["result"] = result.to_json()
        # Atomic, not fsynced (as libcni): the entry must survive a restart of cnidra, which the
        # page cache does; a node crash takes the pod namespaces with it.
        write_atomically(self.path(network, rt), json.dumps(entry).encode(), durable=False)

    def load(self, network: str, rt: RuntimeConf) -> CachedAttachment | None:
        return self._read(self.path(network, rt))

    def remove(self, network: str, rt: RuntimeConf) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(network, rt).unlink()

    def attachments(self, container_id: str = "") -> Iterator[CachedAttachment]:
        """Readable cache entries, optionally of one container (libcni's GetCachedAttachments)."""
        try:
            names = sorted(os.listdir(self.dir))
        except FileNotFoundError:
            return
        for name in names:
            if name.startswith("."):
                continue
            if container_id and f"-{container_id}-" not in name:
                continue
            entry = self._read(self.dir / name)
            if entry is not None and (not container_id or entry.container_id == container_id):
                yield entry

    @staticmethod
    def _read(path: Path) -> CachedAttachment | None:
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError) as exc:
            raise CacheError(f"cache file {path} is unreadable: {exc}") from None
        if not isinstance(data, dict) or data.get("kind") != CACHE_KIND:
            return None
        try:
            return CachedAttachment(
                network=data["networkName"],
                container_id=data["containerId"],
                if_name=data["ifName"],
                netns=data.get("netns", ""),
                config=base64.b64decode(data.get("config") or ""),
                cni_args=tuple((str(k), str(v)) for k, v in data.get("cniArgs") or []),
                capability_args=dict(data.get("capabilityArgs") or {}),
                result=data.get("result"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CacheError(f"cache file {path} is malformed: {exc}") from None
