"""A tenant's network, decoded once into the form the plugins will read. Pure: no I/O.

The plugins read their stdin with Go's `encoding/json`: a key matches a struct field
case-insensitively (with Unicode simple folding, so `i\u017fGateway` with a long s is
`isGateway` and the Kelvin sign is `k`), and when two keys match one field the last one wins.
Python reads the same bytes exactly. Every difference between those two readings would let a
policy judge one config while the plugin runs another, so a tenant's network is held to a
form both read alike:

- every key is ASCII, and spelled exactly as the field it sets (`IsGateway` is refused with
  "write 'isGateway'"; nothing folds);
- no two keys of one object are the same field in any spelling;
- every key is a field cnidra knows for that plugin (its schema, release v1.9.1), unless the
  admin wrote it (a path the DeviceClass sets) or the class's CNIPolicy opens it by name
  (`claims.pluginFields`);
- numbers are integers that fit the plugins' int64 (the plugins read no fractions), strings
  are valid Unicode (Go turns a lone surrogate into U+FFFD).

What passes is the canonical form: the policy judges it (`TenantNetwork`'s typed accessors),
and the runtime serialises exactly it, with only the fields the driver owns (network name,
cniVersion, dataDir, runtimeConfig, prevResult) written by the driver, in their one spelling.
"""

from __future__ import annotations

import ipaddress
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from cnidra.api.issues import FieldPath, Issues, describe
from cnidra.api.plugin_schema import _load_json, known_types, schema_for

Path = tuple[str | int, ...]
INT64 = (-(2**63), 2**63 - 1)

# Keys every plugin's Go config carries (types.NetConf) that the schemas leave out because no
# user writes them: the runtime does.
DRIVER_OWNED_COMMON = ("runtimeConfig", "prevResult", "cni.dev/valid-attachments")
# Fields of the plugin-level (conflist) header a tenant may write exactly; `name` and
# `cniVersion` are replaced by the runtime's for every plugin of a list.
HEADER_FIELDS = ("cniVersion", "cniVersions", "name", "disableCheck", "disableGC", "plugins")


def fold(key: str) -> str:
    """ASCII case folding: for ASCII keys this is exactly Go's EqualFold."""
    return key.lower()


# ------------------------------------------------------------------ the generic rules


def ambiguities(value: Any, path: FieldPath, issues: Issues) -> None:
    """Errors for everything Go and Python would read differently, anywhere in a tree."""
    stack: list[tuple[Any, FieldPath]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, Mapping):
            seen: dict[str, str] = {}
            for key, child in item.items():
                if not isinstance(key, str):
                    issues.error(where, f"key {key!r} is not a string")
                    continue
                if not key.isascii():
                    bad = next(c for c in key if not c.isascii())
                    issues.error(
                        where / key,
                        f"key holds {bad!r} (U+{ord(bad):04X}); keys must be ASCII: the "
                        "plugins fold some letters onto ASCII ones (U+017F is s, U+212A is k), "
                        "so such a key sets another field than the one it seems to",
                    )
                    continue
                other = seen.get(fold(key))
                if other is not None:
                    issues.error(
                        where / key,
                        f"is the same field as {other!r} to the plugins (they match keys "
                        "case-insensitively and keep the last); write it once",
                    )
                seen[fold(key)] = key
                stack.append((child, where / key))
        elif isinstance(item, list):
            stack.extend((child, where / i) for i, child in enumerate(item))
        elif isinstance(item, float):
            issues.error(where, f"{item!r} is not an integer; the plugins read whole numbers only")
        elif isinstance(item, int) and not isinstance(item, bool):
            if not INT64[0] <= item <= INT64[1]:
                issues.error(where, f"{item} does not fit a 64-bit integer")
        elif isinstance(item, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in item):
            issues.error(where, "holds a lone UTF-16 surrogate, which is not text")


def written_by(raw: Path, admin: frozenset[Path]) -> bool:
    """Whether the path lies in what the admin wrote (at or below one of `admin`'s paths): a
    lookup of each of its prefixes, whatever the number of paths the admin wrote."""
    return bool(admin) and any(raw[:n] in admin for n in range(len(raw) + 1))


# ------------------------------------------------------------------ schema walking


@cache
def _defs() -> dict[str, Any]:
    defs: dict[str, Any] = _load_json("defs.json")["$defs"]
    return defs


def _resolve(node: Any) -> dict[str, Any]:
    while isinstance(node, dict) and "$ref" in node:
        ref = str(node["$ref"])
        node = _defs()[ref.rsplit("/", 1)[-1]]
    return node if isinstance(node, dict) else {}


@dataclass
class _Walk:
    """One tenant network's walk: where the admin wrote, what the policy opened."""

    issues: Issues
    admin: frozenset[Path]
    opened: Mapping[str, Sequence[str]]

    def is_admin(self, raw: Path) -> bool:
        return written_by(raw, self.admin)

    def struct(
        self,
        value: Mapping[str, Any],
        props: Mapping[str, Any],
        owner: str,
        raw: Path,
        where: FieldPath,
        *,
        skip: Sequence[str] = (),
    ) -> None:
        """Keys of a Go struct: exactly a field's spelling, or refused."""
        exact = {fold(k): k for k in props}
        for key, child in value.items():
            if not isinstance(key, str) or not key.isascii() or key in skip:
                continue  # reported by `ambiguities`, or handled by the caller
            if self.is_admin((*raw, key)):
                continue
            if key in props:
                self.value(child, props[key], owner, (*raw, key), where / key)
                continue
            known = exact.get(fold(key))
            if known is not None:
                self.issues.error(
                    where / key,
                    f"is spelled differently from the field {known!r} the plugin reads it as; "
                    f"write {known!r}",
                )
            elif key not in self.opened.get(owner, ()):
                self.issues.error(
                    where / key,
                    f"is not a field cnidra knows for {owner}; a claim may set only known "
                    "fields (the DeviceClass's CNIPolicy may open others in "
                    f"claims.pluginFields[{owner!r}]); known: "
                    + ", ".join(sorted(k for k in props if k not in DRIVER_OWNED_COMMON)),
                )

    def value(self, value: Any, schema: Any, owner: str, raw: Path, where: FieldPath) -> None:
        node = _resolve(schema)
        if isinstance(value, Mapping):
            if "properties" in node:
                self.struct(value, node["properties"], owner, raw, where)
            elif isinstance(node.get("additionalProperties"), dict):
                for key, child in value.items():
                    self.value(child, node["additionalProperties"], owner, (*raw, key), where / key)
        elif isinstance(value, list) and "items" in node:
            for i, child in enumerate(value):
                self.value(child, node["items"], owner, (*raw, i), where / i)


# ------------------------------------------------------------------ the decoded form


@dataclass(frozen=True)
class TenantIPAM:
    type: str
    fields: Mapping[str, Any]
    path: FieldPath


@dataclass(frozen=True)
class TenantPlugin:
    type: str
    fields: Mapping[str, Any]  # exact spellings only: what the plugin reads, as it reads it
    path: FieldPath
    raw: Path  # where in the network config (conf or conflist) the plugin is
    ipam: TenantIPAM | None = None

    def get(self, name: str) -> Any:
        return self.fields.get(name)


@dataclass(frozen=True)
class Address:
    path: FieldPath
    raw: Path  # where in the network config: whether the admin or the tenant wrote it
    text: str  # an address, or an address with a prefix length


@dataclass(frozen=True)
class VlanSpan:
    path: FieldPath
    raw: Path
    low: int
    high: int


@dataclass(frozen=True)
class TenantNetwork:
    """A network in the form that runs. `config` is the conf or conflist as decoded (it is
    what the runtime serialises); `plugins` the typed view the policy judges. Paths in `admin`
    (raw paths into `config`) were written by the DeviceClass and are not the tenant's."""

    config: Mapping[str, Any]
    plugins: tuple[TenantPlugin, ...]
    admin: frozenset[Path] = field(default_factory=frozenset)
    valid: bool = True

    def is_admin(self, raw: Path) -> bool:
        return written_by(raw, self.admin)

    def tenant_fields(self) -> Iterator[tuple[TenantPlugin, str, FieldPath]]:
        """Each plugin field the tenant wrote."""
        for plugin in self.plugins:
            for key in plugin.fields:
                if not self.is_admin((*plugin.raw, key)):
                    yield plugin, key, plugin.path / key

    def tenant_args(self) -> Iterator[tuple[TenantPlugin, FieldPath, str, Any]]:
        """Each `args.cni` setting the tenant wrote (tuning reads its link settings there
        too): the plugin, where, the key and its value."""
        for plugin in self.plugins:
            args = plugin.get("args")
            cni = args.get("cni") if isinstance(args, Mapping) else None
            if not isinstance(cni, Mapping) or self.is_admin((*plugin.raw, "args")):
                continue
            for key, value in cni.items():
                yield plugin, plugin.path / "args" / "cni" / key, str(key), value

    def tenant_ipam_fields(self) -> Iterator[tuple[TenantPlugin, str, FieldPath]]:
        for plugin in self.plugins:
            if plugin.ipam is None:
                continue
            for key in plugin.ipam.fields:
                if not self.is_admin((*plugin.raw, "ipam", key)):
                    yield plugin, key, plugin.ipam.path / key

    def addresses(self) -> Iterator[Address]:
        """Every address or subnet the network would give the pod, from every field a plugin
        reads one from: IPAM subnets, ranges and static addresses, and the conventions'
        `args.cni.ips`."""
        for plugin in self.plugins:
            if plugin.ipam is not None:
                yield from _ipam_addresses(plugin.ipam, (*plugin.raw, "ipam"))
            yield from _args_ips(plugin.get("args"), plugin.path / "args", (*plugin.raw, "args"))

    def vlans(self) -> Iterator[VlanSpan]:
        """Every VLAN ID a plugin would put the pod's traffic on."""
        for plugin in self.plugins:
            path, raw = plugin.path, plugin.raw
            vid = plugin.get("vlanId")
            if plugin.type == "vlan" and isinstance(vid, int):
                yield VlanSpan(path / "vlanId", (*raw, "vlanId"), vid, vid)
            if plugin.type != "bridge":
                continue
            vid = plugin.get("vlan")
            if isinstance(vid, int) and vid != 0:
                yield VlanSpan(path / "vlan", (*raw, "vlan"), vid, vid)
            else:
                # no access VLAN: the port is on the bridge's default VLAN 1 (the plugin makes
                # 1 the native VLAN of a trunk, and a port of a VLAN-filtering bridge gets 1);
                # the tenant's doing if they wrote the trunk, or the bridge itself
                cause = "vlanTrunk" if plugin.get("vlanTrunk") else "type"
                yield VlanSpan(path / "vlan", (*raw, cause), 1, 1)
            if plugin.get("preserveDefaultVlan") is True:  # VLAN 1 kept beside the others
                yield VlanSpan(path / "preserveDefaultVlan", (*raw, "preserveDefaultVlan"), 1, 1)
            trunks = plugin.get("vlanTrunk")
            for i, trunk in enumerate(trunks if isinstance(trunks, list) else []):
                if not isinstance(trunk, Mapping):
                    continue
                where, at = path / "vlanTrunk" / i, (*raw, "vlanTrunk", i)
                if _is_int(trunk.get("id")):
                    yield VlanSpan(where / "id", at, trunk["id"], trunk["id"])
                low, high = trunk.get("minID"), trunk.get("maxID")
                if _is_int(low) or _is_int(high):
                    # the bridge plugin trunks minID..maxID; a missing bound is the far end
                    lo = low if isinstance(low, int) and not isinstance(low, bool) else 1
                    hi = high if isinstance(high, int) and not isinstance(high, bool) else 4094
                    yield VlanSpan(where / "minID", at, lo, hi)


def is_zero(value: Any) -> bool:
    """Go's zero value, which a plugin reads as the field left out (`isGateway: false`)."""
    if value is None or value is False:
        return True
    return not isinstance(value, bool) and value in ("", 0, [], {})


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_ADDRESS_KEYS = ("subnet", "rangeStart", "rangeEnd", "gateway")


def _ipam_addresses(ipam: TenantIPAM, raw: Path) -> Iterator[Address]:
    f, path = ipam.fields, ipam.path
    for key in _ADDRESS_KEYS:
        if isinstance(f.get(key), str):
            yield Address(path / key, (*raw, key), f[key])
    ranges = f.get("ranges")
    for i, rset in enumerate(ranges if isinstance(ranges, list) else []):
        for j, rng in enumerate(rset if isinstance(rset, list) else []):
            if not isinstance(rng, Mapping):
                continue
            for key in _ADDRESS_KEYS:
                if isinstance(rng.get(key), str):
                    yield Address(
                        path / "ranges" / i / j / key, (*raw, "ranges", i, j, key), rng[key]
                    )
    addresses = f.get("addresses")
    for i, addr in enumerate(addresses if isinstance(addresses, list) else []):
        if not isinstance(addr, Mapping):
            continue
        for key in ("address", "gateway"):
            if isinstance(addr.get(key), str):
                yield Address(path / "addresses" / i / key, (*raw, "addresses", i, key), addr[key])


def _args_ips(args: Any, path: FieldPath, raw: Path) -> Iterator[Address]:
    cni = args.get("cni") if isinstance(args, Mapping) else None
    ips = cni.get("ips") if isinstance(cni, Mapping) else None
    for i, ip in enumerate(ips if isinstance(ips, list) else []):
        if isinstance(ip, str):
            yield Address(path / "cni" / "ips" / i, (*raw, "cni", "ips", i), ip)


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def address_outside(text: str, allowed: Sequence[Network]) -> bool | None:
    """Whether an address (or subnet) lies outside every allowed range; None: not an address
    (the validator says so). An IPv4-mapped IPv6 address is the IPv4 one, as Go reads it.
    One lookup per prefix length the ranges use, however many ranges are allowed."""
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError:
        return None
    if isinstance(net, ipaddress.IPv6Network) and net.network_address.ipv4_mapped is not None:
        mapped = net.network_address.ipv4_mapped
        net = ipaddress.ip_network(f"{mapped}/{max(net.prefixlen - 96, 0)}", strict=False)
    by_length = _ranges(allowed).get(net.version, {})
    start = int(net.network_address)
    return not any(
        length <= net.prefixlen and start >> (net.max_prefixlen - length) in prefixes
        for length, prefixes in by_length.items()
    )


# The allowed ranges of a policy by address family and prefix length, each as the set of its
# networks' leading bits; kept for the few policies judged last (the same list object is asked
# about every address of a network), each with the list it was made from.
_RangeIndex = dict[int, dict[int, set[int]]]
_INDEXED: OrderedDict[int, tuple[Sequence[Network], _RangeIndex]] = OrderedDict()
_INDEXED_MAX = 16
_INDEXED_LOCK = threading.Lock()


def _ranges(allowed: Sequence[Network]) -> _RangeIndex:
    with _INDEXED_LOCK:
        known = _INDEXED.get(id(allowed))
        if known is not None and known[0] is allowed:
            _INDEXED.move_to_end(id(allowed))
            return known[1]
    index: _RangeIndex = {}
    for a in allowed:
        lengths = index.setdefault(a.version, {})
        lengths.setdefault(a.prefixlen, set()).add(
            int(a.network_address) >> (a.max_prefixlen - a.prefixlen)
        )
    with _INDEXED_LOCK:
        _INDEXED[id(allowed)] = (allowed, index)
        while len(_INDEXED) > _INDEXED_MAX:
            _INDEXED.popitem(last=False)
    return index


# ------------------------------------------------------------------ decoding


def decode_network(
    config: Mapping[str, Any],
    path: FieldPath,
    issues: Issues,
    *,
    admin: frozenset[Path] = frozenset(),
    opened: Mapping[str, Sequence[str]] | None = None,
) -> TenantNetwork:
    """The tenant's network in canonical form; `valid` False when something in it is read
    differently by Go and Python (every reason in `issues`). Judge it either way, to report
    everything at once, but never run an invalid one.
    `config` is a conf or a conflist object (a JSON string is parsed before, by the one strict
    reader, `cnidra.api.parameters`)."""
    before = issues.error_count
    ambiguities(config, path, issues)
    walk = _Walk(issues, admin, opened or {})
    common = _common_props()
    plugins: list[TenantPlugin] = []
    if "plugins" in config:
        for key in config:
            if (
                isinstance(key, str)
                and key.isascii()
                and key not in HEADER_FIELDS
                and not walk.is_admin((key,))
            ):
                known = next((h for h in HEADER_FIELDS if fold(h) == fold(key)), None)
                hint = f"write {known!r}" if known else f"allowed: {', '.join(HEADER_FIELDS)}"
                issues.error(path / key, f"is not a conflist field as written; {hint}")
        items = config.get("plugins")
        located: list[tuple[Any, Path, FieldPath]] = [
            (p, ("plugins", i), path / "plugins" / i)
            for i, p in enumerate(items if isinstance(items, list) else [])
        ]
    else:
        located = [(config, (), path)]
    for plugin, raw, where in located:
        if not isinstance(plugin, Mapping):
            continue  # the validator names it
        ptype = plugin.get("type")
        if not isinstance(ptype, str):
            continue
        schema = schema_for("plugins", ptype)
        props: dict[str, Any] = dict(schema.document["properties"]) if schema else dict(common)
        for owned in DRIVER_OWNED_COMMON:
            props.setdefault(owned, {})
        walk.struct(plugin, props, f"{ptype}", raw, where, skip=("ipam", "args"))
        ipam = _decode_ipam(plugin.get("ipam"), walk, (*raw, "ipam"), where / "ipam")
        if "args" in plugin and not walk.is_admin((*raw, "args")):
            _decode_args(plugin["args"], walk, ptype, (*raw, "args"), where / "args")
        plugins.append(TenantPlugin(ptype, {k: v for k, v in plugin.items()}, where, raw, ipam))
    return TenantNetwork(config, tuple(plugins), admin, valid=issues.error_count == before)


@cache
def _common_props() -> dict[str, Any]:
    common = dict(_defs()["common"])
    common.pop("$comment", None)
    return common


def _decode_ipam(value: Any, walk: _Walk, raw: Path, where: FieldPath) -> TenantIPAM | None:
    if not isinstance(value, Mapping) or not value:
        return None
    itype = value.get("type")
    if not isinstance(itype, str):
        # no type as written: a `TYPE` would still be the plugin Go execs
        walk.struct(value, {"type": {}}, "ipam", raw, where)
        return None
    schema = schema_for("ipam", itype) if itype in known_types("ipam") else None
    props: dict[str, Any] = dict(schema.document["properties"]) if schema else {"type": {}}
    walk.struct(value, props, itype, raw, where)
    return TenantIPAM(itype, dict(value), where)


# The conventions' `args.cni` keys the reference plugins read (host-local and static: ips;
# tuning: mac and its link settings); anything else under args is a field no plugin reads.
_ARGS_CNI = {
    "ips": {"type": "array", "items": {"type": "string"}},
    "mac": {"type": "string"},
    "sysctl": {"type": "object", "additionalProperties": {"type": "string"}},
    "promisc": {"type": "boolean"},
    "mtu": {"type": "integer"},
    "allmulti": {"type": "boolean"},
    "txQLen": {"type": "integer"},
}


def _decode_args(value: Any, walk: _Walk, owner: str, raw: Path, where: FieldPath) -> None:
    """`args` in a plugin's config (the CNI conventions' `args.cni`): only the keys a
    reference plugin reads, each in its one spelling."""
    if not isinstance(value, Mapping):
        walk.issues.error(where, f"must be an object, got {describe(value)}")
        return
    walk.struct(value, {"cni": {"type": "object", "properties": _ARGS_CNI}}, owner, raw, where)
