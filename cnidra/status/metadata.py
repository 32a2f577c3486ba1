"""Device metadata containers can read (KEP-5304, alpha in Kubernetes 1.36): per claim request,
a JSON file naming the allocated devices and, once the sandbox hook has attached them, their
network data (interface, addresses, MAC). Prepare writes the file and a CDI spec that
bind-mounts it read-only into every container using the claim; kubelet passes the CDI device
IDs to the runtime. The hook fills in `networkData` before any container starts.

Wire facts (k8s.io/dynamic-resource-allocation v0.36 `api/metadata`, `kubeletplugin`):
- in the container: /var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/
  <request>/<driver>-metadata.json, or .../resourceclaimtemplates/<pod claim name>/... for a
  claim made from a template;
- on the node, upstream's helper writes <kubelet plugin dir>/dra-device-metadata/<namespace>_
  <claim>/<request>/metadata.json; cnidra writes <cdi dir>/<driver>-metadata/<namespace>_
  <claim>_<request>.json, one directory for all (`_` is in no namespace, claim or request
  name, so the name is unambiguous), beside the CDI specs that mount them: what only the
  runtime reads through a CDI spec lives as long as the spec, on the same tmpfs (/var/run/cdi;
  a reboot empties both), and a prepare writes no file to the node's disk (measured: a file
  created on this project's test machine's disk costs about 1 ms, on its tmpfs 12 us). The
  runtime's CDI scan skips subdirectories. Files an earlier cnidra wrote in the kubelet plugin
  directory (flat, or one directory per claim) stay there for the claims that have them
  (running containers mount their inodes): `restore` at start finds them, and the claim's
  spec, its updates and its removal go on using them;
  CDI spec <cdi dir>/<driver>_metadata_<claim uid>_<request>.json of kind <driver>/metadata,
  device <claim uid>_<request>;
- content: `metadata.resource.k8s.io/v1alpha1` DeviceMetadata, one JSON document per line.

Updates rewrite the file in place (same inode): a bind mount keeps the inode it was given."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from cnidra.api.constants import DRIVER_NAME
from cnidra.api.refs import ObjectRef
from cnidra.state.checkpoint import PreparedClaim

API_VERSION = "metadata.resource.k8s.io/v1alpha1"
CONTAINER_DIR = Path("/var/run/kubernetes.io/dra-device-attributes")
CDI_VERSION = "0.5.0"
DEFAULT_CDI_DIR = Path("/var/run/cdi")


def base_request(request: str) -> str:
    """A firstAvailable subrequest ("parent/sub") is filed under its parent request."""
    return request.split("/", 1)[0]


class DeviceMetadata:
    """Each prepared claim request's CDI device: the metadata file's bind mount (`mounts`), and
    the container gate's createRuntime hook (`gate`: its argv as the node runs it;
    cnidra.state.gate) that keeps the container from starting before its interfaces exist."""

    def __init__(
        self,
        plugin_dir: Path,
        cdi_dir: Path,
        driver: str = DRIVER_NAME,
        *,
        mounts: bool = True,
        gate: list[str] | None = None,
        gate_timeout: int = 30,
    ) -> None:
        self.root = cdi_dir / f"{driver}-metadata"
        # where an earlier cnidra wrote them, and the files found there at start
        self.legacy_root = plugin_dir / "dra-device-metadata"
        self._legacy: set[str] = set()
        self.cdi_dir = cdi_dir
        self.driver = driver
        self.mounts = mounts
        self.gate = gate
        self.gate_timeout = gate_timeout
        self._root_text = str(self.root)
        self._legacy_text = str(self.legacy_root)
        self._cdi_text = str(self.cdi_dir)

    # ------------------------------------------------------------------ paths

    def legacy_claim_dir(self, claim: ObjectRef) -> Path:
        """Where the claim's files were before they were all in one directory."""
        return self.legacy_root / f"{claim.namespace}_{claim.name}"

    def legacy_file(self, claim: ObjectRef, request: str) -> Path:
        """Where the claim's file was before it moved beside the CDI specs."""
        return self.legacy_root / _file_name(claim, request)

    def host_file(self, claim: ObjectRef, request: str) -> Path:
        """The request's file on the node: beside the CDI specs, or where an earlier cnidra
        wrote it when `restore` found it there."""
        return Path(self._host_text(claim, request))

    def container_file(self, claim: PreparedClaim, request: str) -> Path:
        if claim.pod_claim_name:
            where = CONTAINER_DIR / "resourceclaimtemplates" / claim.pod_claim_name
        else:
            where = CONTAINER_DIR / "resourceclaims" / claim.ref.name
        return where / request / f"{self.driver}-metadata.json"

    def cdi_file(self, claim_uid: str, request: str) -> Path:
        return self.cdi_dir / f"{self.driver}_metadata_{claim_uid}_{request}.json"

    def cdi_id(self, claim_uid: str, request: str) -> str:
        return f"{self.driver}/metadata={claim_uid}_{request}"

    # ------------------------------------------------------------------ writes

    def prepare(
        self, claim: PreparedClaim, attributes: Mapping[str, Mapping[str, Any]] | None = None
    ) -> None:
        """Write each request's metadata file (unless there is one: a re-prepare after a
        restart must keep the network data the hook filled in) and its CDI spec. Paths as
        text here, not pathlib's (which interns every part: a claim's name and UID each time)."""
        for request in dict.fromkeys(d.request for d in claim.devices):
            base = base_request(request)
            host = self._host_text(claim.ref, base)
            if self.mounts:
                fd = _open_new(host)
                if fd is not None:
                    devices = [
                        _device(self.driver, d.pool, d.device, (attributes or {}).get(d.device))
                        for d in claim.devices
                        if d.request == request
                    ]
                    document = self._document(claim.ref, claim.pod_claim_name, 1, request, devices)
                    _write_and_close(fd, (json.dumps(document, separators=(",", ":")) + "\n"))
            self._write_cdi_spec(claim, base, host)

    def restore(
        self, claim: PreparedClaim, attributes: Mapping[str, Mapping[str, Any]] | None = None
    ) -> None:
        """`prepare` at start. A file an earlier cnidra wrote in the kubelet plugin directory
        stays there and is used on (the same inode, with the network data the hook filled in:
        containers running mount it); one of the per-claim directories before that is moved
        to that directory's flat name first (the same file system: the same inode)."""
        legacy = self.legacy_claim_dir(claim.ref)
        requests = list(dict.fromkeys(base_request(d.request) for d in claim.devices))
        if legacy.is_dir():
            for request in requests:
                old = legacy / request / "metadata.json"
                flat = self.legacy_file(claim.ref, request)
                if old.exists() and not flat.exists():
                    os.replace(old, flat)
            shutil.rmtree(legacy, ignore_errors=True)
        if self.legacy_root.is_dir():
            for request in requests:
                flat = self.legacy_file(claim.ref, request)
                if flat.exists():
                    self._legacy.add(str(flat))
        self.prepare(claim, attributes)

    def prepare_all(
        self,
        claims: Iterable[PreparedClaim],
        attributes: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """`prepare` for each of a batch: one call (one hop to a worker thread for a kubelet
        batch, not one per claim)."""
        for claim in claims:
            self.prepare(claim, attributes)

    def attached(
        self,
        claim: ObjectRef,
        request: str,
        pool: str,
        device: str,
        network_data: Mapping[str, Any],
    ) -> None:
        """The hook's part: the device's network data, before the pod's containers start."""
        path = self.host_file(claim, base_request(request))
        try:
            current = json.loads(path.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return  # prepared before metadata existed, or removed: nothing a container reads
        [req] = current.get("requests") or [{"name": request, "devices": []}]
        for entry in req.get("devices") or []:
            if (entry.get("pool"), entry.get("name")) == (pool, device):
                entry["networkData"] = dict(network_data)
        current["metadata"]["generation"] = int(current["metadata"].get("generation", 1)) + 1
        _write_in_place(path, current)

    def remove(self, claim: ObjectRef, requests: Iterable[str] | None = None) -> None:
        """The claim's files; with its requests known, without reading the CDI directory
        (which holds a spec per prepared request of the node: a glob per unprepare made
        unprepare slower with every claim prepared)."""
        if requests is None:
            hosts = [
                *self.root.glob(f"{claim.namespace}_{claim.name}_*.json"),
                *self.legacy_root.glob(f"{claim.namespace}_{claim.name}_*.json"),
            ]
            specs = list(self.cdi_dir.glob(f"{self.driver}_metadata_{claim.uid}_*.json"))
        else:
            bases = dict.fromkeys(base_request(r) for r in requests)
            hosts = [self.host_file(claim, r) for r in bases]
            specs = [self.cdi_file(claim.uid, r) for r in bases]
        for path in [*hosts, *specs]:
            self._legacy.discard(str(path))
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        if self._legacy or requests is None:
            # one prepared before the files were all in one directory, and not restored since
            shutil.rmtree(self.legacy_claim_dir(claim), ignore_errors=True)

    def _document(
        self,
        claim: ObjectRef,
        pod_claim_name: str | None,
        generation: int,
        request: str,
        devices: list[dict[str, Any]],
    ) -> dict[str, Any]:
        document: dict[str, Any] = {
            "kind": "DeviceMetadata",
            "apiVersion": API_VERSION,
            "metadata": {
                "name": claim.name,
                "namespace": claim.namespace,
                "uid": claim.uid,
                "generation": generation,
            },
            "requests": [{"name": request, "devices": devices}],
        }
        if pod_claim_name:
            document["podClaimName"] = pod_claim_name
        return document

    def _host_text(self, claim: ObjectRef, request: str) -> str:
        """`host_file`, as text."""
        name = _file_name(claim, request)
        if self._legacy:
            legacy = f"{self._legacy_text}/{name}"
            if legacy in self._legacy:
                return legacy
        return f"{self._root_text}/{name}"

    def _write_cdi_spec(self, claim: PreparedClaim, request: str, host: str) -> None:
        edits: dict[str, Any] = {}
        if self.mounts:
            if claim.pod_claim_name:
                where = f"{CONTAINER_DIR}/resourceclaimtemplates/{claim.pod_claim_name}"
            else:
                where = f"{CONTAINER_DIR}/resourceclaims/{claim.ref.name}"
            edits["mounts"] = [
                {
                    "hostPath": host,
                    "containerPath": f"{where}/{request}/{self.driver}-metadata.json",
                    "options": ["ro", "bind"],
                }
            ]
        if self.gate:
            edits["hooks"] = [
                {
                    "hookName": "createRuntime",
                    "path": self.gate[0],
                    "args": list(self.gate),
                    "timeout": self.gate_timeout,
                }
            ]
        spec = {
            "cdiVersion": CDI_VERSION,
            "kind": f"{self.driver}/metadata",
            "devices": [{"name": f"{claim.uid}_{request}", "containerEdits": edits}],
        }
        name = f"{self.driver}_metadata_{claim.uid}_{request}.json"  # cdi_file's
        path, tmp = f"{self._cdi_text}/{name}", f"{self._cdi_text}/.{name}.tmp"
        # the temporary file first: the runtime may read the directory anytime
        data = json.dumps(spec, separators=(",", ":")).encode()
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except FileNotFoundError:  # the first spec, or the directory removed (a tmpfs)
            self.cdi_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.fchmod(fd, 0o644)  # whatever the umask: the runtime reads it
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)


def _file_name(claim: ObjectRef, request: str) -> str:
    return f"{claim.namespace}_{claim.name}_{request}.json"


def _device(
    driver: str, pool: str, name: str, attributes: Mapping[str, Any] | None
) -> dict[str, Any]:
    device: dict[str, Any] = {"driver": driver, "pool": pool, "name": name}
    if attributes:
        device["attributes"] = dict(attributes)
    return device


def _open_new(path: str) -> int | None:
    """A new file at `path`, open for writing, its directories made when missing; None when
    there is one (left as it is). One open in the usual cases, not a stat, mkdirs and an open."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        return os.open(path, flags, 0o644)
    except FileExistsError:
        return None
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    try:
        return os.open(path, flags, 0o644)
    except FileExistsError:
        return None


def _write_and_close(fd: int, text: str) -> None:
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _write_in_place(path: Path, document: Mapping[str, Any]) -> None:
    data = (json.dumps(document, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:  # over the old bytes, then cut: a reader never finds the file empty
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
