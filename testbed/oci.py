"""The one OCI image archive writer (the layout `ctr images import` and registries' tools
read), used by `make image` (hack/image/build.sh) and by the test bed's own images
(testbed/mkimage.py). Deterministic: members sorted, owners and times fixed, gzip without a
timestamp, JSON with sorted keys; same inputs, same digest.

    python -m testbed.oci OUT.tar REF --layer BASE.tar [--layer APP.tar] [--drop PATH] --config JSON
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

EPOCH = 0


def normalized_layer(source: Path, drop: set[str], mtime: int) -> bytes:
    """The tarball's members in name order, owned by root, at `mtime`; `drop` removed."""
    with tarfile.open(source) as src:
        members = sorted(src.getmembers(), key=lambda m: m.name)
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as out:
            for member in members:
                name = member.name.removeprefix("./")
                if not name or name in drop or any(name.startswith(d + "/") for d in drop):
                    continue
                info = tarfile.TarInfo(name)
                info.type, info.mode, info.linkname = member.type, member.mode, member.linkname
                info.size = member.size if member.isfile() else 0
                info.mtime = min(int(member.mtime), mtime)
                info.uid, info.gid, info.uname, info.gname = member.uid, member.gid, "", ""
                info.devmajor, info.devminor = member.devmajor, member.devminor
                data = src.extractfile(member) if member.isfile() else None
                out.addfile(info, data)
    return raw.getvalue()


def _blob(tar: tarfile.TarFile, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size, info.mode, info.mtime = len(data), 0o644, EPOCH
    tar.addfile(info, io.BytesIO(data))
    return f"sha256:{digest}"


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def write(out: Path, ref: str, layers: list[bytes], config: dict[str, object], created: str) -> str:
    """Returns the manifest digest: the image's identity."""
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        descriptors, diff_ids = [], []
        for layer in layers:
            diff_ids.append(f"sha256:{hashlib.sha256(layer).hexdigest()}")
            packed = gzip.compress(layer, compresslevel=6, mtime=0)
            descriptors.append(
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": _blob(tar, packed),
                    "size": len(packed),
                }
            )
        image_config = _json(
            {
                "architecture": "amd64",
                "os": "linux",
                "created": created,
                "config": config,
                "rootfs": {"type": "layers", "diff_ids": diff_ids},
            }
        )
        manifest = _json(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": _blob(tar, image_config),
                    "size": len(image_config),
                },
                "layers": descriptors,
            }
        )
        manifest_digest = _blob(tar, manifest)
        index = _json(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.index.v1+json",
                "manifests": [
                    {
                        "mediaType": "application/vnd.oci.image.manifest.v1+json",
                        "digest": manifest_digest,
                        "size": len(manifest),
                        "platform": {"architecture": "amd64", "os": "linux"},
                        "annotations": {
                            "io.containerd.image.name": ref,
                            "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[-1],
                        },
                    }
                ],
            }
        )
        for name, data in (
            ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
            ("index.json", index),
        ):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, EPOCH
            tar.addfile(info, io.BytesIO(data))
    return manifest_digest


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("ref")
    parser.add_argument("--layer", type=Path, action="append", required=True)
    parser.add_argument("--drop", action="append", default=[], help="path to leave out")
    parser.add_argument("--config", required=True, help="the image config's `config` as JSON")
    parser.add_argument("--epoch", type=int, default=0, help="SOURCE_DATE_EPOCH")
    args = parser.parse_args()
    layers = [normalized_layer(p, set(args.drop), args.epoch) for p in args.layer]
    created = "1970-01-01T00:00:00Z"
    print(write(args.out, args.ref, layers, json.loads(args.config), created))


if __name__ == "__main__":
    main()
