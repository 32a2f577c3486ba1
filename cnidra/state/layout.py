"""Where each kind of state lives under cnidra's state root."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from cnidra.api.ownership import PrivateDirs

DEFAULT_STATE_ROOT = Path("/var/lib/cnidra")
# Where cnidra 0.1 kept its CNI result cache and host-local its pools: the node's shared CNI
# directory, which the primary CNI uses too. Read once, by the migration, and never again.
LEGACY_CNI_DIR = Path("/var/lib/cni")


@dataclass(frozen=True)
class StateLayout:
    root: Path = DEFAULT_STATE_ROOT

    @property
    def claims(self) -> Path:
        """The prepared-claims checkpoint, one file per claim."""
        return self.root / "claims"

    @property
    def sandboxes(self) -> Path:
        """Write-ahead sandbox records: what cnidra added to which sandbox."""
        return self.root / "sandboxes"

    @property
    def cni_cache(self) -> Path:
        """The CNI result cache (libcni's format, under `results/`)."""
        return self.root / "cni"

    @property
    def ipam(self) -> Path:
        """host-local's dataDir (the admin's host-local networks: a claim's is refused), one pool
        directory per owned network name; cnidra IPAM's blocks and leases are under `pools/`."""
        return self.root / "ipam"

    @property
    def tuning(self) -> Path:
        return self.root / "tuning"

    @property
    def finalizer_releases(self) -> Path:
        """Finalizer removals queued for the apiserver, kept until it took them."""
        return self.root / "finalizer-releases"

    @property
    def journal(self) -> Path:
        """What happened to pods' networks on this node (the node API's events)."""
        return self.root / "journal.jsonl"

    @property
    def gate(self) -> Path:
        """The container gate's script (cnidra.state.gate), run by the runtime as a hook."""
        return self.root / "bin" / "cnidra-gate"

    @property
    def node_socket(self) -> Path:
        """The node API's unix socket (root only)."""
        return self.root / "node.sock"

    def write_problem(self) -> str | None:
        """Why the state root cannot take a write now (full, read-only, gone), or None: a small
        file written, synced and removed."""
        probe = self.root / ".write-probe"
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, b"x" * 4096)
                os.fsync(fd)
            finally:
                os.close(fd)
            probe.unlink()
        except OSError as exc:
            with contextlib.suppress(OSError):
                probe.unlink()
            return f"cnidra's state root {self.root} cannot be written: {exc.strerror or exc}"
        return None

    def private_dirs(self) -> PrivateDirs:
        return PrivateDirs(ipam=str(self.ipam), tuning=str(self.tuning))
