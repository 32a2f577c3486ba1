"""cnidra's plugin schemas describe the plugins the test bed builds: the release they name is
the one hack/install-cni.sh installs, and their fields are the fields the plugins' Go source
reads (the source of exactly that release, from the Go module proxy, cached by Go)."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import pytest

from cnidra.api.plugin_schema import known_types, schema_for

ROOT = Path(__file__).parents[2]
MODULE = "github.com/containernetworking/plugins"
# read by every plugin through the embedded types.NetConf, or nested below a field of ours
COMMON = {"args", "cni", "runtimeConfig", "prevResult", "bandwidth", "portMappings"}
DIRS = {
    "bridge": "plugins/main/bridge", "dummy": "plugins/main/dummy",
    "host-device": "plugins/main/host-device", "ipvlan": "plugins/main/ipvlan",
    "loopback": "plugins/main/loopback", "macvlan": "plugins/main/macvlan",
    "ptp": "plugins/main/ptp", "tap": "plugins/main/tap", "vlan": "plugins/main/vlan",
    "bandwidth": "plugins/meta/bandwidth", "firewall": "plugins/meta/firewall",
    "portmap": "plugins/meta/portmap", "sbr": "plugins/meta/sbr",
    "tuning": "plugins/meta/tuning", "vrf": "plugins/meta/vrf",
}  # fmt: skip


def installed_release() -> str:
    text = (ROOT / "hack" / "install-cni.sh").read_text()
    match = re.search(r'CNI_PLUGINS_VERSION="\$\{CNI_PLUGINS_VERSION:-(v[\d.]+)\}"', text)
    assert match, "hack/install-cni.sh names no plugins release"
    return match[1]


@cache
def source_dir() -> Path:
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"{MODULE}@{installed_release()}"],
        check=True, capture_output=True, text=True, timeout=600, cwd=tempfile.gettempdir(),
    ).stdout  # fmt: skip
    return Path(json.loads(out)["Dir"])


def go_fields(plugin: str) -> set[str]:
    """JSON field names the plugin's config struct reads: the struct that embeds
    types.NetConf/PluginConf, with the structs it embeds in turn (bandwidth's BandwidthEntry).
    Empty for a plugin that reads a bare types.NetConf (dummy, loopback)."""
    src = "".join(
        p.read_text()
        for p in (source_dir() / DIRS[plugin]).glob("*.go")
        if not p.name.endswith("_test.go")
    )
    structs = dict(re.findall(r"type (\w+)\s+struct\s*\{(.*?)\n\}", src, re.S))
    fields: set[str] = set()
    for body in structs.values():
        if "types.NetConf" in body or "types.PluginConf" in body:
            fields |= set(re.findall(r'json:"([A-Za-z0-9_]+)', body))
            for embedded in re.findall(r"^\s*\*?(\w+)\s*$", body, re.M):
                fields |= set(re.findall(r'json:"([A-Za-z0-9_]+)', structs.get(embedded, "")))
    return fields


def test_the_schemas_name_the_release_the_test_bed_installs() -> None:
    schema = schema_for("plugins", "bridge")
    assert schema is not None and schema.release == installed_release()


def test_every_reference_plugin_has_a_schema() -> None:
    assert set(DIRS) == set(known_types("plugins"))


@pytest.mark.parametrize("plugin", sorted(DIRS))
def test_the_schema_lists_what_the_plugin_reads(plugin: str) -> None:
    schema = schema_for("plugins", plugin)
    assert schema is not None
    ours = set(schema.own_fields)
    theirs = go_fields(plugin) - COMMON
    assert sorted(theirs - ours) == [], f"{plugin} reads fields the schema does not list"
    assert sorted(ours - theirs) == [], (
        f"the schema lists fields {plugin} {installed_release()} does not read"
    )
