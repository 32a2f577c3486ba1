"""Moving what cnidra 0.1 left in the node's shared CNI directory under cnidra's own state root.

cnidra 0.1 passed the user's `config.name` to plugins, kept its CNI result cache in
`/var/lib/cni/results` and let host-local keep its pools in `/var/lib/cni/networks/<name>`.
Pods attached then must keep their interfaces across the upgrade, and be DELed correctly later,
so for every attachment a sandbox record holds (and only those: a record is the proof of
ownership, a file in the shared directory is not):

- the record's network gets today's name (`cnidra-ns.<namespace>.<name>`) and state directories;
- its cache entry moves from `<legacy>/results/` to cnidra's cache, renamed;
- its host-local reservations (files naming its container ID and ifName) move into the new
  pool directory, so the pool that new pods of that network draw from knows them.

Nothing else in the shared directory is read or touched. Idempotent: an attachment whose network
is already cnidra's is left alone. Run at driver start (the chart runs it once in an init
container, the only place that mounts the shared directory) or as `cnidra migrate-state`.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cnidra.api.ownership import is_owned, owned_network, owned_network_name
from cnidra.cni.attach import Attachment
from cnidra.state.layout import StateLayout
from cnidra.state.sandboxes import Attached, SandboxRecord, SandboxStore
from cnidra.util.files import write_atomically

log = logging.getLogger(__name__)


@dataclass
class MigrationReport:
    attachments: int = 0
    cache_entries: int = 0
    reservations: int = 0
    missing: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        text = (
            f"migrated {self.attachments} attachment(s): {self.cache_entries} cache "
            f"entr{'y' if self.cache_entries == 1 else 'ies'}, {self.reservations} "
            "host-local reservation(s)"
        )
        if self.missing:
            text += "; not found in the legacy directory: " + ", ".join(self.missing)
        return text


def migrate_legacy(layout: StateLayout, legacy: Path, store: SandboxStore) -> MigrationReport:
    report = MigrationReport()
    for record in store.all():
        if all(is_owned(str(a.attachment.network.get("name", ""))) for a in record.attachments):
            continue
        moved = tuple(_migrate(record, a, layout, legacy, report) for a in record.attachments)
        store.put_blocking(replace(record, attachments=moved))
    if report.attachments:
        log.info("%s", report)
    return report


def _migrate(
    record: SandboxRecord,
    attached: Attached,
    layout: StateLayout,
    legacy: Path,
    report: MigrationReport,
) -> Attached:
    att = attached.attachment
    old_name = str(att.network.get("name", ""))
    if is_owned(old_name):
        return attached
    new_name = owned_network_name(old_name, att.claim.namespace)
    network = owned_network(att.network, new_name, layout.private_dirs())
    what = f"{record.sandbox_id[:12]}/{att.if_name}"
    if _move_cache_entry(legacy, layout, old_name, new_name, record.sandbox_id, att, network):
        report.cache_entries += 1
    else:
        report.missing.append(f"cache entry of {what}")
    for data_dir in _host_local_dirs(att.network, legacy):
        report.reservations += _move_reservations(
            data_dir / old_name, layout.ipam / new_name, record.sandbox_id, att.if_name
        )
    report.attachments += 1
    moved = replace(att, network=network, network_label=att.network_label or old_name)
    return replace(attached, attachment=moved)


def _move_cache_entry(
    legacy: Path,
    layout: StateLayout,
    old_name: str,
    new_name: str,
    container_id: str,
    att: Attachment,
    network: Mapping[str, Any],
) -> bool:
    source = legacy / "results" / f"{old_name}-{container_id}-{att.if_name}"
    try:
        entry = json.loads(source.read_bytes())
    except (OSError, ValueError):
        return False
    if not isinstance(entry, dict) or entry.get("containerId") != container_id:
        return False
    entry["networkName"] = new_name
    entry["config"] = base64.b64encode(json.dumps(network, separators=(",", ":")).encode()).decode()
    target = layout.cni_cache / "results" / f"{new_name}-{container_id}-{att.if_name}"
    write_atomically(target, json.dumps(entry).encode(), durable=True)
    source.unlink(missing_ok=True)
    return True


def _host_local_dirs(network: Mapping[str, Any], legacy: Path) -> list[Path]:
    """Where host-local kept this network's pool: its dataDir, or the default under legacy."""
    dirs = []
    for plugin in network.get("plugins") or [network]:
        ipam = plugin.get("ipam") if isinstance(plugin, Mapping) else None
        if isinstance(ipam, Mapping) and ipam.get("type") == "host-local":
            data_dir = ipam.get("dataDir")
            dirs.append(Path(data_dir) if isinstance(data_dir, str) else legacy / "networks")
    return dirs


def _move_reservations(source: Path, target: Path, container_id: str, if_name: str) -> int:
    """host-local writes one file per address holding `<containerID>\\r\\n<ifName>` (older
    releases: the container ID alone); move those of this attachment."""
    try:
        names = sorted(os.listdir(source))
    except OSError:
        return 0
    moved = 0
    for name in names:
        path = source / name
        if name.startswith((".", "last_reserved_ip", "lock")) or not path.is_file():
            continue
        try:
            lines = [line.strip() for line in path.read_text().splitlines()]
        except (OSError, UnicodeDecodeError):
            continue
        if not lines or lines[0] != container_id or (len(lines) > 1 and lines[1] != if_name):
            continue
        write_atomically(target / name, path.read_bytes(), mode=0o644, durable=True)
        path.unlink(missing_ok=True)
        moved += 1
    return moved
