from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

FAULTS = Path(__file__).parent / "faults"


def bridge_list(
    tmp: Path,
    *extra: dict[str, Any],
    version: str = "1.0.0",
    name: str = "tnet",
    subnet: str = "198.18.1.0/24",
    bridge: str = "cnidra-br0",
    with_routes: bool = True,
) -> dict[str, Any]:
    return {
        "cniVersion": version,
        "name": name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(tmp / "ipam"),
                    "ranges": [[{"subnet": subnet}]],
                    **({"routes": [{"dst": "203.0.113.0/24"}]} if with_routes else {}),
                },
            },
            *extra,
        ],
    }


def links(ns: Path) -> dict[str, dict[str, Any]]:
    out = subprocess.run(
        ["ip", "-n", ns.name, "-j", "-d", "addr"],
        check=True,
        text=True,
        capture_output=True,
        timeout=30,
    ).stdout
    return {link["ifname"]: link for link in json.loads(out)}


def addresses(ns: Path, ifname: str) -> set[str]:
    link = links(ns).get(ifname)
    if link is None:
        return set()
    return {f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"] if a["scope"] == "global"}


def routes(ns: Path, *args: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        ["ip", "-n", ns.name, "-j", *args, "route"],
        check=True,
        text=True,
        capture_output=True,
        timeout=30,
    ).stdout
    return list(json.loads(out or "[]"))


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, timeout=60).stdout


def allocations(tmp: Path, network: str = "tnet") -> set[str]:
    d = tmp / "ipam" / network
    if not d.exists():
        return set()
    return {p.name for p in d.iterdir() if p.name[0].isdigit() or ":" in p.name}
