"""cnidra and cnitool (libcni) set up the same thing, and each DELs what the other added.

cnitool always uses /var/lib/cni for its cache; it runs in a private mount namespace where a
tmpfs over /var/lib holds a bind mount of the test's cache directory, so the host's /var/lib is
never touched and both tools share one cache."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cnidra.cni import CNIRuntime, NetworkConfigList, RuntimeConf
from tests.cni.helpers import allocations, bridge_list, links, routes, sh
from tests.conftest import CNITools

pytestmark = pytest.mark.netns


def cnitool(tools: CNITools, command: str, config: dict[str, Any], pod: Path, tmp: Path) -> Any:
    confdir = tmp / "netconf"
    confdir.mkdir(exist_ok=True)
    (confdir / f"{config['name']}.conflist").write_text(json.dumps(config))
    cache = tmp / "cache"
    cache.mkdir(exist_ok=True)
    script = (
        "mount -t tmpfs cnidra-test /var/lib && mkdir /var/lib/cni && "
        f'mount --bind "{cache}" /var/lib/cni && exec "{tools.cnitool}" {command} '
        f'"{config["name"]}" "{pod}"'
    )
    env = {
        **os.environ,
        "NETCONFPATH": str(confdir),
        "CNI_PATH": tools.plugins,
        "CNI_IFNAME": "net1",
    }
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return json.loads(proc.stdout) if proc.stdout.strip() else None


def cnitool_container_id(pod: Path) -> str:
    return "cnitool-" + hashlib.sha512(str(pod).encode()).hexdigest()[:20]


def snapshot(pod: Path) -> dict[str, Any]:
    """What a pod would see, minus what is random by design (MACs, ifindexes)."""
    ifaces = {}
    for name, link in links(pod).items():
        ifaces[name] = {
            "kind": (link.get("linkinfo") or {}).get("info_kind"),
            "mtu": link["mtu"],
            "up": "UP" in link["flags"],
            "addrs": sorted(
                f"{a['local']}/{a['prefixlen']}"
                for a in link["addr_info"]
                if a["scope"] == "global"
            ),
        }
    rts = sorted((r["dst"], r.get("gateway", ""), r["dev"]) for r in routes(pod))
    return {"links": ifaces, "routes": rts}


def reset_host_local(tmp: Path) -> None:
    for f in (tmp / "ipam").glob("*/last_reserved_ip*"):
        f.unlink()


CONFIGS = {
    "bridge-tuning": lambda tmp: bridge_list(tmp, {"type": "tuning", "mtu": 1400}),
    "macvlan-static": lambda tmp: {
        "cniVersion": "1.1.0",
        "name": "mv",
        "plugins": [
            {
                "type": "macvlan",
                "master": "data0",
                "mode": "bridge",
                "ipam": {
                    "type": "static",
                    "addresses": [{"address": "192.0.2.20/24", "gateway": "192.0.2.1"}],
                    "routes": [{"dst": "198.51.100.0/24", "gw": "192.0.2.1"}],
                },
            }
        ],
    },
    "ptp-host-local": lambda tmp: {
        "cniVersion": "0.4.0",
        "name": "ptp",
        "plugins": [
            {
                "type": "ptp",
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(tmp / "ipam"),
                    "ranges": [[{"subnet": "198.18.4.0/24"}]],
                },
            }
        ],
    },
}


@pytest.fixture
def runtime(cni_tools: CNITools, tmp_path: Path, in_node: Path) -> CNIRuntime:
    sh("ip", "-n", in_node.name, "link", "add", "data0", "type", "veth", "peer", "name", "data0p")
    sh("ip", "-n", in_node.name, "link", "set", "data0", "up")
    return CNIRuntime([cni_tools.plugins], cache_dir=str(tmp_path / "cache"), timeout=10)


@pytest.mark.parametrize("which", sorted(CONFIGS))
async def test_same_interfaces_addresses_and_routes(
    cni_tools: CNITools, runtime: CNIRuntime, pod_netns: Path, tmp_path: Path, which: str
) -> None:
    config = CONFIGS[which](tmp_path)
    empty = snapshot(pod_netns)
    by_cnitool = cnitool(cni_tools, "add", config, pod_netns, tmp_path)
    seen_cnitool = snapshot(pod_netns)
    cnitool(cni_tools, "del", config, pod_netns, tmp_path)
    assert snapshot(pod_netns) == empty
    reset_host_local(tmp_path)

    rt = RuntimeConf(cnitool_container_id(pod_netns), str(pod_netns), "net1")
    net = NetworkConfigList.from_dict(config)
    by_cnidra = await runtime.add(net, rt)
    seen_cnidra = snapshot(pod_netns)
    await runtime.delete(net, rt)
    assert snapshot(pod_netns) == empty

    assert seen_cnidra == seen_cnitool
    assert "net1" in seen_cnidra["links"]
    assert comparable(by_cnidra.to_json()) == comparable(by_cnitool)


def comparable(result: dict[str, Any]) -> dict[str, Any]:
    """A result minus what is random by design: MACs and host-side veth names."""
    ifaces = [
        {
            k: ("veth*" if k == "name" and str(v).startswith("veth") else v)
            for k, v in i.items()
            if k != "mac"
        }
        for i in result.get("interfaces", [])
    ]
    return {**result, "interfaces": ifaces}


@pytest.mark.parametrize("which", sorted(CONFIGS))
async def test_each_deletes_what_the_other_added(
    cni_tools: CNITools, runtime: CNIRuntime, pod_netns: Path, tmp_path: Path, which: str
) -> None:
    config = CONFIGS[which](tmp_path)
    net = NetworkConfigList.from_dict(config)
    rt = RuntimeConf(cnitool_container_id(pod_netns), str(pod_netns), "net1")
    cache_file = tmp_path / "cache" / "results" / f"{config['name']}-{rt.container_id}-net1"

    cnitool(cni_tools, "add", config, pod_netns, tmp_path)
    assert cache_file.exists()
    entry = runtime.cache.load(config["name"], rt)
    assert entry is not None and entry.result is not None
    await runtime.delete(NetworkConfigList.from_bytes(entry.config), entry.runtime_conf())
    assert "net1" not in links(pod_netns) and allocations(tmp_path, config["name"]) == set()
    assert not cache_file.exists()

    await runtime.add(net, rt)
    assert cache_file.exists()
    cnitool(cni_tools, "check", config, pod_netns, tmp_path) if net.at_least("0.4.0") else None
    cnitool(cni_tools, "del", config, pod_netns, tmp_path)
    assert "net1" not in links(pod_netns) and allocations(tmp_path, config["name"]) == set()
    assert not cache_file.exists()
