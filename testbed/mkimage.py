"""Writes OCI image archives from Debian's busybox-static, with no registry and no Docker.

    python -m testbed.mkimage OUT.tar REF [--entrypoint JSON]

One layer: /bin/busybox and a symlink for every applet (sh, sleep, ip, cat, ...), /tmp, /etc
stubs. The archive's index names the image with `io.containerd.image.name`, which
`ctr images import` uses as the image reference. Deterministic: same busybox, same bytes
(written by testbed.oci, the writer `make image` uses too).
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import tarfile
from pathlib import Path

from testbed import oci

BUSYBOX = "/bin/busybox"
EPOCH = 0


def _info(
    name: str, kind: bytes = tarfile.REGTYPE, mode: int = 0o755, size: int = 0, link: str = ""
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.linkname, info.mtime = kind, mode, size, link, EPOCH
    info.uid = info.gid = 0
    return info


def layer() -> bytes:
    applets = subprocess.run(
        [BUSYBOX, "--list"], check=True, capture_output=True, text=True
    ).stdout.split()
    with open(BUSYBOX, "rb") as f:
        binary = f.read()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("bin", "etc", "tmp", "proc", "sys", "dev", "var", "root"):
            tar.addfile(_info(d, tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755))
        tar.addfile(_info("bin/busybox", size=len(binary)), io.BytesIO(binary))
        for applet in sorted(set(applets) - {"busybox"}):
            tar.addfile(_info(f"bin/{applet}", tarfile.SYMTYPE, 0o777, link="busybox"))
        for name, text in (
            ("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"),
            ("etc/group", "root:x:0:\n"),
        ):
            data = text.encode()
            tar.addfile(_info(name, mode=0o644, size=len(data)), io.BytesIO(data))
    return buf.getvalue()


def write(out: str, ref: str, entrypoint: list[str]) -> None:
    config = {"Entrypoint": entrypoint, "Env": ["PATH=/bin"], "WorkingDir": "/"}
    oci.write(Path(out), ref, [layer()], config, "1970-01-01T00:00:00Z")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("ref")
    parser.add_argument("--entrypoint", default='["/bin/sh"]')
    args = parser.parse_args()
    write(args.out, args.ref, json.loads(args.entrypoint))


if __name__ == "__main__":
    main()
