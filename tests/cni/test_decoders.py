"""The policy reads a tenant's network as the plugins do, proven against the plugins' own
decoders: each plugin of release v1.9.1, built from the Go module proxy with one added file
(hack/build-decoders.sh) that unmarshals stdin into that plugin's own config struct.

A hypothesis fuzzer writes tenant configs as a hostile tenant would (JSON text with duplicate
keys, case and Unicode variants of the fields that matter, string and object forms, every
plugin the default class allows and some it does not, addresses and VLANs in and out of the
class's ranges). For every config the one verdict allows, the bytes the runtime would give each
plugin are decoded by that plugin's Go struct, and every security-relevant field Go reads
(type, IPAM type, addresses, VLANs, paths, sockets, isGateway, ipMasq, forceAddress, hairpin
and promiscuous modes, names, runtimeConfig, prevResult) must be what the policy approved.

`make test` runs a bounded number of examples (CNIDRA_FUZZ_EXAMPLES, default 150); `make fuzz`
runs many more."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cnidra.api.ownership import PrivateDirs
from cnidra.api.refs import ObjectRef
from cnidra.api.validate import validate_documents
from cnidra.cni.runtime import _plugin_stdin
from cnidra.dra.resolve import Device, attachment_from
from tests.api.test_policy import DEFAULT_CLASSES, claim
from tests.api.test_tenant import RESTRICTED
from tests.conftest import cache_lock

ROOT = Path(__file__).parents[2]
EXAMPLES = int(os.environ.get("CNIDRA_FUZZ_EXAMPLES", "150"))
ALLOWED_RANGE = ipaddress.ip_network("198.18.0.0/16")
ALLOWED_VLANS = range(100, 200)
DIRS = PrivateDirs(ipam="/var/lib/cnidra/ipam", tuning="/var/lib/cnidra/tuning")


@cache
def decoders() -> Path:
    with cache_lock("build-decoders"):
        out = subprocess.run(
            [str(ROOT / "hack" / "build-decoders.sh")],
            check=True, capture_output=True, text=True, timeout=900,
        ).stdout  # fmt: skip
    return Path(out.strip().splitlines()[-1])


def go_read(plugin: str, stdin: bytes) -> dict[str, Any]:
    """What the plugin's own struct holds after encoding/json read `stdin`."""
    done = subprocess.run(
        [str(decoders() / plugin)],
        input=stdin.replace(b"\n", b" ") + b"\n",
        capture_output=True, timeout=30, check=False, env={**os.environ, "CNIDRA_DECODE": "1"},
    )  # fmt: skip
    line = json.loads(done.stdout.decode().splitlines()[0])
    assert "error" not in line, f"{plugin} refused what the policy allowed: {line}: {stdin!r}"
    conf: dict[str, Any] = line["conf"]
    return conf


# ------------------------------------------------------------------ hostile configs

LONG_S, KELVIN = "\u017f", "\u212a"


def spellings(key: str) -> st.SearchStrategy[str]:
    variants = {key, key.upper(), key.lower(), key[:1].upper() + key[1:], key.swapcase()}
    if "s" in key:
        variants.add(key.replace("s", LONG_S, 1))
    if "k" in key.lower():
        variants.add(key.replace("k", KELVIN).replace("K", KELVIN))
    # mostly the exact spelling, so that many configs pass and reach the decoders
    return st.sampled_from([key] * 12 + sorted(variants))


ADDRESSES = st.sampled_from(
    ["198.18.1.0/24", "198.18.7.0/24", "10.50.0.0/16", "::ffff:10.50.0.0/120", "192.0.2.0/24"]
)
HOSTS = st.sampled_from(["198.18.1.10/24", "10.50.0.9/16", "::ffff:10.50.0.9/120"])
GATEWAYS = st.sampled_from(["198.18.1.1", "10.50.0.1", "198.18.7.1"])
VLANS = st.sampled_from([0, 100, 150, 199, 200, 4000])
PATHS = st.sampled_from(["/etc", "/run/evil.sock", "/var/lib/cni"])

FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "isGateway": st.booleans(),
    "isDefaultGateway": st.booleans(),
    "ipMasq": st.booleans(),
    "forceAddress": st.booleans(),
    "hairpinMode": st.booleans(),
    "promiscMode": st.booleans(),
    "macspoofchk": st.booleans(),
    "vlan": VLANS,
    "vlanId": VLANS,
    "vlanTrunk": st.lists(
        st.fixed_dictionaries(
            {"minID": st.sampled_from([100, 150, 190]), "maxID": st.sampled_from([150, 199, 300])}
        ),
        max_size=2,
    ),
    "mode": st.sampled_from(["bridge", "passthru", "private", "l2", "l3"]),
    "master": st.sampled_from(["link0", "eth0"]),
    "bridge": st.sampled_from(["link0", "cbr0"]),
    "mtu": st.sampled_from([1400, 9000]),
    "dataDir": PATHS,
    "name": st.sampled_from(["n", "cnidra-ns.team-b.blue"]),
    "runtimeConfig": st.just({"portMappings": [{"hostPort": 10250, "containerPort": 80}]}),
    "prevResult": st.just({"cniVersion": "1.0.0", "ips": []}),
    "args": st.builds(lambda ip: {"cni": {"ips": [ip]}}, HOSTS),
    "table": st.sampled_from([100, 254]),
    "promisc": st.booleans(),
    "allmulti": st.booleans(),
    "preserveDefaultVlan": st.booleans(),
    "vrfname": st.just("vrf0"),
    "kernelpath": PATHS,
}
PLUGIN_FIELDS = {
    "bridge": ["bridge", "isGateway", "isDefaultGateway", "ipMasq", "forceAddress",
               "hairpinMode", "promiscMode", "macspoofchk", "vlan", "vlanTrunk", "mtu",
               "preserveDefaultVlan"],
    "macvlan": ["master", "mode", "mtu"],
    "ipvlan": ["master", "mode", "mtu"],
    "vlan": ["master", "vlanId", "mtu"],
    "tuning": ["mtu", "promisc", "allmulti"],
    "sbr": ["table"],
    "vrf": ["vrfname", "table"],
    "ptp": ["ipMasq", "mtu"],
}  # fmt: skip
COMMON = ["name", "args"]
HOSTILE = ["runtimeConfig", "prevResult", "kernelpath", "dataDir", "resolvConf",
           "daemonSocketPath"]  # fmt: skip

IPAM_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "subnet": ADDRESSES,
    "ranges": st.lists(
        st.lists(st.fixed_dictionaries({"subnet": ADDRESSES}), min_size=1, max_size=1),
        min_size=1,
        max_size=2,
    ),
    "addresses": st.lists(
        st.fixed_dictionaries({"address": HOSTS}, optional={"gateway": GATEWAYS}),
        min_size=1,
        max_size=2,
    ),
    "dataDir": PATHS,
    "resolvConf": st.just("/etc/shadow"),
    "daemonSocketPath": PATHS,
}


Pairs = list[tuple[str, Any]]


@st.composite
def obj(draw: st.DrawFn, fields: dict[str, st.SearchStrategy[Any]], names: list[str]) -> Pairs:
    """An object as key/value pairs: spelled as a tenant likes, keys sometimes repeated."""
    chosen = draw(st.lists(st.sampled_from(names), max_size=5, unique=True)) if names else []
    if draw(st.integers(0, 3)) == 3:  # a field only the runtime or the admin may set
        chosen.append(draw(st.sampled_from([n for n in HOSTILE if n in fields])))
    pairs = [(draw(spellings(k)), draw(fields[k])) for k in dict.fromkeys(chosen)]
    if pairs and draw(st.integers(0, 3)) == 3:  # the same field again, in another spelling
        key = draw(st.sampled_from(chosen))
        pairs.append((draw(spellings(key)), draw(fields[key])))
    return pairs


@st.composite
def ipam(draw: st.DrawFn) -> Pairs:
    itype = draw(st.sampled_from(["host-local", "static", "dhcp"]))
    names = {
        "host-local": ["subnet", "ranges"],
        "static": ["addresses"],
        "dhcp": [],
    }[itype]
    pairs = [(draw(spellings("type")), itype), *draw(obj(IPAM_VALUES, names))]
    if draw(st.integers(0, 9)) == 9:  # a second type, as Go would read it
        pairs.append((draw(spellings("type")), draw(st.sampled_from(["host-local", "dhcp"]))))
    return pairs


@st.composite
def plugin(draw: st.DrawFn, ptype: str) -> Pairs:
    values = {**FIELD_VALUES}
    required = {"macvlan": "master", "ipvlan": "master", "vlan": "master", "vrf": "vrfname"}
    pairs: Pairs = [("type", ptype)]
    if ptype in required:
        pairs.append((required[ptype], draw(values[required[ptype]])))
    if ptype == "vlan":
        pairs.append(("vlanId", draw(values["vlanId"])))
    names = [n for n in PLUGIN_FIELDS[ptype] + COMMON if n not in (*required.values(), "vlanId")]
    pairs += draw(obj(values, names))
    if ptype in ("bridge", "macvlan", "ipvlan", "vlan", "ptp") and draw(st.booleans()):
        pairs.append((draw(spellings("ipam")), draw(ipam())))
    return pairs


def to_json(value: Any) -> str:
    """JSON text of pairs (keys may repeat, as a tenant may write them) and plain values."""
    if (
        isinstance(value, list)
        and value
        and all(isinstance(p, tuple) and len(p) == 2 for p in value)
    ):
        return "{" + ",".join(f"{json.dumps(k)}:{to_json(v)}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ",".join(to_json(v) for v in value) + "]"
    return json.dumps(value)


@st.composite
def tenant_config(draw: st.DrawFn) -> str | dict[str, Any]:
    first = draw(st.sampled_from(["bridge", "macvlan", "ipvlan", "vlan", "ptp"]))
    chained = draw(st.lists(st.sampled_from(["tuning", "sbr", "vrf"]), max_size=1))
    plugins = [draw(plugin(first)), *[draw(plugin(t)) for t in chained]]
    text = to_json([("cniVersion", "1.1.0"), ("name", "n"), ("plugins", [p for p in plugins])])
    if draw(st.booleans()):
        return text
    # the object form, where the text has no repeated key (YAML and the API refuse those)
    try:
        from cnidra.api.loading import LoadError, load_json

        value: dict[str, Any] = load_json(text)
        return value
    except LoadError:
        return text


# ------------------------------------------------------------------ the property


def allowed_network(config: str | dict[str, Any], device_class: str) -> dict[str, Any] | None:
    """The network the runtime would run for this claim, or None when the verdict refuses."""
    doc = claim({"ifName": "net1", "config": config}, device_class)
    [report] = validate_documents([doc], [*DEFAULT_CLASSES, RESTRICTED], {})
    if report.issues.errors:
        return None
    [resolved] = report.resolved
    ref = ObjectRef("team-a", "c", "uid-1")
    attachment = attachment_from(resolved, ref, Device("pool", "link0", None, "link0"), DIRS)
    # None: it names another link than the allocated one, which prepare refuses
    return dict(attachment.network) if attachment is not None else None


def check_plugin(net: dict[str, Any], plugin: dict[str, Any], restricted: bool) -> None:
    from cnidra.cni.types import NetworkConfigList, RuntimeConf

    conf = NetworkConfigList.from_dict(net)
    stdin = _plugin_stdin(conf, plugin, None, RuntimeConf("c1", "/run/netns/x", "net1"))
    ptype = plugin["type"]
    go = go_read(ptype, stdin)
    assert go.get("type") == ptype
    assert go.get("name") in (None, conf.name)  # some structs leave the name to types.NetConf
    assert not go.get("runtimeConfig") or go["runtimeConfig"] in ({}, {"mac": ""}), go
    assert not go.get("prevResult"), go
    for key in PLUGIN_FIELDS.get(ptype, []):
        if key in go and key not in ("dataDir",):
            expected = plugin.get(key)
            want = expected if expected is not None else type(go[key])()
            if key == "vlanTrunk":
                got = [{k: v for k, v in t.items() if v} for t in go[key] or []]
                want = [{k: v for k, v in t.items() if v} for t in (expected or [])]
                assert got == want, (key, go, plugin)
                continue
            assert go[key] == want, (key, go[key], plugin)
    if ptype == "tuning":  # a macvlan child's flags reach its host parent
        assert go.get("dataDir") == DIRS.tuning
        assert not go.get("promisc") and not go.get("allmulti"), go
    if ptype == "bridge":
        assert not any(go.get(k) for k in ("isGateway", "ipMasq", "forceAddress", "promiscMode"))
        if restricted:  # the port's VLANs, VLAN 1 included where the plugin leaves it
            assert go.get("vlan") in ALLOWED_VLANS and not go.get("preserveDefaultVlan"), go
    if restricted:
        for key in ("vlan", "vlanId"):
            if go.get(key):
                assert go[key] in ALLOWED_VLANS, go
    ipam_type = (go.get("ipam") or {}).get("type") or ""
    python_ipam = plugin.get("ipam") or {}
    assert ipam_type == (python_ipam.get("type") or ""), (go, plugin)
    if ipam_type in ("host-local", "static", "dhcp"):
        check_ipam(ipam_type, stdin, python_ipam, restricted)
    go_cni = (go.get("args") or {}).get("cni") or {}
    if "ips" in go_cni:  # only the structs that read args.cni.ips have it
        assert (go_cni["ips"] or []) == (
            ((plugin.get("args") or {}).get("cni") or {}).get("ips") or []
        )


def as_go(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """A subnet as Go's types.IPNet holds it: an IPv4-mapped IPv6 subnet is the IPv4 one."""
    net = ipaddress.ip_network(text, strict=False)
    mapped = net.network_address.ipv4_mapped if isinstance(net, ipaddress.IPv6Network) else None
    if mapped is not None and net.prefixlen >= 96:
        return ipaddress.ip_network(f"{mapped}/{net.prefixlen - 96}", strict=False)
    return net


def inside(text: str) -> bool:
    net = as_go(text)
    return net.version == 4 and net.subnet_of(ALLOWED_RANGE)  # type: ignore[arg-type]


def check_ipam(itype: str, stdin: bytes, python: dict[str, Any], restricted: bool) -> None:
    go = go_read(itype, stdin)["ipam"]
    assert go.get("type") == itype
    if itype == "host-local":
        assert go.get("dataDir") == DIRS.ipam
        assert not go.get("resolvConf")
        subnets = [r["subnet"] for rs in go.get("ranges") or [] for r in rs]
        expected = [r["subnet"] for rs in python.get("ranges") or [] for r in rs]
        assert list(map(as_go, subnets)) == list(map(as_go, expected)), (go, python)
        if restricted:
            assert all(inside(s) for s in subnets), go
    if itype == "static":
        got = [a["address"] for a in go.get("addresses") or []]
        assert got == [a["address"] for a in python.get("addresses") or []]
        if restricted:
            assert all(inside(a) for a in got), go
    if itype == "dhcp":
        assert not go.get("daemonSocketPath"), go


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(config=tenant_config(), restricted=st.booleans())
def test_what_the_policy_allows_is_what_the_plugins_read(
    config: str | dict[str, Any], restricted: bool
) -> None:
    device_class = "restricted" if restricted else "cni.networking.x-k8s.io"
    net = allowed_network(config, device_class)
    if net is None:
        return
    for plugin in net["plugins"]:
        check_plugin(net, plugin, restricted)


def test_the_decoders_read_as_go_does() -> None:
    """The decoders are the plugins' readers: Go folds `\u017f` onto `s` and keeps the last."""
    stdin = '{"type":"bridge","i\u017fGateway":true,"IsGateway":false,"ISGATEWAY":true}'
    assert go_read("bridge", stdin.encode())["isGateway"] is True
