"""Validation and normalisation of a CNI network configuration (a conf or a conflist)."""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cnidra.api.constants import (
    DEFAULT_CNI_VERSION,
    STATUS_DATA_MAX_BYTES,
    SUPPORTED_CNI_VERSIONS,
)
from cnidra.api.issues import FieldPath, Issues, describe, json_type
from cnidra.api.ownership import state_field_problems
from cnidra.api.plugin_schema import (
    FORMAT_HINTS,
    PluginSchema,
    parse_interface,
    parse_ip,
    schema_for,
)

if TYPE_CHECKING:
    from jsonschema import ValidationError

# The CNI spec's rule for network names, and a bare executable name for `type`.
NETWORK_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$")
PLUGIN_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+\-]*$")
CONFLIST_KEYS = (
    "cniVersion",
    "cniVersions",
    "name",
    "disableCheck",
    "disableGC",
    "loadOnlyInlinedPlugins",
    "plugins",
)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def plugin_type_problem(value: object) -> str | None:
    """Why `value` may not be used as a plugin `type` (it becomes an exec'd file name)."""
    if not isinstance(value, str):
        return f"must be a string naming a plugin binary, got {describe(value)}"
    if value == "":
        return "must not be empty"
    if "/" in value or "\\" in value or value in (".", "..") or not PLUGIN_TYPE.match(value):
        return (
            f"{value!r} is not a bare plugin name: it must be a file name found on the "
            "CNI path (letters, digits, '.', '_', '-', '+'), never a path"
        )
    return None


def is_conflist(config: Mapping[str, Any]) -> bool:
    return "plugins" in config


def to_conflist(config: Mapping[str, Any]) -> dict[str, Any]:
    """A single-plugin conf as the equivalent conflist (libcni's ConfListFromConf)."""
    if is_conflist(config):
        return dict(config)
    plugin = dict(config)
    out: dict[str, Any] = {}
    for key in ("cniVersion", "name"):
        if key in plugin:
            out[key] = plugin[key]
    for key in ("disableCheck", "disableGC"):
        if key in plugin:
            out[key] = plugin.pop(key)
    out["plugins"] = [plugin]
    return out


def validate_network_config(
    config: Any, path: FieldPath, issues: Issues, *, complete: bool = True
) -> None:
    """Report every problem of a conf/conflist object at `path`.

    `complete=False` is for partial configs (a DeviceClass's defaults): fields that another
    config level may still supply are not required.
    """
    if not isinstance(config, dict):
        issues.error(path, f"must be a CNI network configuration object, got {describe(config)}")
        return
    if is_conflist(config):
        _validate_conflist(config, path, issues, complete)
    elif "type" in config:
        _validate_header(config, path, issues, complete)
        _validate_plugin(config, path, issues, config.get("cniVersion"), single=True)
        if _role(config) == "chained":  # a lone conf is a list of one: nothing before it
            issues.error(path / "type", _CHAINED_ALONE.format(config["type"]))
    elif complete:
        issues.error(
            path,
            "must be a conflist (with a plugins list) or a single-plugin conf "
            "(with a type); found neither",
        )
    state_field_problems(config, path, issues)
    size = len(json.dumps(config, separators=(",", ":")))
    if size > STATUS_DATA_MAX_BYTES:
        issues.warn(
            path,
            f"is {size} bytes; the ResourceClaim status can echo back at most "
            f"{STATUS_DATA_MAX_BYTES} bytes of data, so the reported result may be trimmed",
        )


def _validate_header(
    config: Mapping[str, Any], path: FieldPath, issues: Issues, complete: bool
) -> None:
    version = config.get("cniVersion")
    if version is None:
        if complete:
            issues.warn(
                path / "cniVersion",
                f"is not set, so libcni and the plugins use {DEFAULT_CNI_VERSION} (no CHECK, "
                "GC or STATUS, no prevResult chaining); set a newer version if the plugins "
                "support it",
            )
    elif version not in SUPPORTED_CNI_VERSIONS:
        issues.error(
            path / "cniVersion",
            f"unsupported version {describe(version)}; allowed: "
            + ", ".join(SUPPORTED_CNI_VERSIONS),
        )
    versions = config.get("cniVersions")
    if versions is not None and (
        not isinstance(versions, list) or not all(isinstance(v, str) for v in versions)
    ):
        issues.error(
            path / "cniVersions", f"must be a list of version strings, got {describe(versions)}"
        )
    name = config.get("name")
    if name is None:
        if complete:
            issues.error(
                path / "name", "is required: the network name (letters, digits, '_', '.', '-')"
            )
    elif not isinstance(name, str) or not NETWORK_NAME.match(name):
        issues.error(
            path / "name",
            f"{describe(name)} is not a valid network name: it must start with "
            "a letter or digit, then letters, digits, '_', '.' or '-'",
        )
    for flag in ("disableCheck", "disableGC", "loadOnlyInlinedPlugins"):
        if flag in config and not isinstance(config[flag], bool):
            issues.error(
                path / flag, f"must be a boolean (true or false), got {describe(config[flag])}"
            )


def _validate_conflist(
    config: Mapping[str, Any], path: FieldPath, issues: Issues, complete: bool
) -> None:
    _validate_header(config, path, issues, complete)
    for key in config:
        if key not in CONFLIST_KEYS:
            issues.error(
                path / key,
                f"unknown conflist field; allowed: {', '.join(CONFLIST_KEYS)} "
                "(plugin settings belong inside plugins[])",
            )
    plugins = config.get("plugins")
    if not isinstance(plugins, list):
        issues.error(path / "plugins", f"must be a list of plugin objects, got {describe(plugins)}")
        return
    if not plugins:
        issues.error(path / "plugins", "must list at least one plugin")
        return
    version = config.get("cniVersion")
    for i, plugin in enumerate(plugins):
        ppath = path / "plugins" / i
        if not isinstance(plugin, dict):
            issues.error(ppath, f"must be a plugin object with a type, got {describe(plugin)}")
            continue
        _validate_plugin(plugin, ppath, issues, version, single=False)
    _check_chain(plugins, path / "plugins", issues)


def _role(plugin: Any) -> str | None:
    """ "interface" (makes the pod's interface), "chained" (needs a prevResult) or None."""
    if not isinstance(plugin, dict) or not isinstance(plugin.get("type"), str):
        return None
    schema = schema_for("plugins", plugin["type"])
    return str(schema.document.get("x-role")) if schema and schema.document.get("x-role") else None


_CHAINED_ALONE = (
    "{} only modifies an interface another plugin made (its ADD fails with no prevResult); "
    "put an interface plugin (macvlan, bridge, ...) before it"
)


def _check_chain(plugins: list[Any], path: FieldPath, issues: Issues) -> None:
    """What makes ADD fail before any packet: a chained plugin with nothing before it to give
    it a prevResult, and two plugins that each make the pod's interface."""
    roles = [_role(p) for p in plugins]
    makers = [i for i, role in enumerate(roles) if role == "interface"]
    for i, plugin in enumerate(plugins):
        # a plugin cnidra does not know (flannel, cilium-cni, ...) may well make the interface
        if roles[i] != "chained":
            break  # every one after has a plugin before it that is not only chained
        issues.error(path / i / "type", _CHAINED_ALONE.format(plugin["type"]))
    for extra in makers[1:]:
        issues.error(
            path / extra / "type",
            f"{plugins[extra]['type']} would make a second interface in one network "
            f"(plugins[{makers[0]}] makes it already); use one network per interface",
        )


def _check_min_version(
    schema: PluginSchema,
    ptype: str,
    list_version: object,
    own_version: object,
    single: bool,
    path: FieldPath,
    issues: Issues,
) -> None:
    minimum = schema.document.get("x-minCNIVersion")
    version = (own_version if single else list_version) or DEFAULT_CNI_VERSION
    if not isinstance(minimum, str) or not isinstance(version, str):
        return
    if version in SUPPORTED_CNI_VERSIONS and _vt(version) < _vt(minimum):
        where = path / "cniVersion" if single else path / "type"
        issues.error(
            where,
            f"{ptype} supports cniVersion {minimum} and later; this config is {version}",
        )


def _vt(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def canonical_keys(
    schema: PluginSchema, plugin: Mapping[str, Any], path: FieldPath, issues: Issues
) -> dict[str, Any]:
    """The plugin's keys as the plugin reads them: Go's JSON decoder matches field names
    case-insensitively (`hairpinmode` sets hairpinMode), so cnidra does too, with a note."""
    fields = {k.lower(): k for k in schema.document["properties"]}
    out: dict[str, Any] = {}
    for key, value in plugin.items():
        canonical = key if key in schema.document["properties"] else fields.get(key.lower(), key)
        if canonical != key:
            issues.warn(
                path / key,
                f"is read as {canonical!r} (field names match case-insensitively in the "
                f"plugins); write {canonical!r}",
            )
        out.setdefault(canonical, value)
    return out


def _validate_plugin(
    plugin: Mapping[str, Any],
    path: FieldPath,
    issues: Issues,
    list_version: object,
    *,
    single: bool,
) -> None:
    if "type" not in plugin:
        issues.error(path / "type", "is required: the name of the plugin binary, e.g. macvlan")
        return
    problem = plugin_type_problem(plugin["type"])
    if problem:
        issues.error(path / "type", problem)
        return
    ptype: str = plugin["type"]
    own_version = plugin.get("cniVersion")
    if not single and own_version is not None and own_version != list_version:
        issues.warn(
            path / "cniVersion",
            f"{describe(own_version)} differs from the conflist's "
            f"cniVersion {describe(list_version)}; libcni runs every plugin with the list's "
            "version, so this one is ignored",
        )
    schema = schema_for("plugins", ptype)
    if schema is None:
        issues.warn(
            path / "type",
            f"{ptype!r} is not a reference plugin cnidra knows; its fields "
            "are not checked (make sure it is installed on the nodes)",
        )
        # such a plugin may read its ipam its own way (calico's usePodCidr): only noted
        if isinstance(plugin.get("ipam"), dict) and plugin["ipam"]:
            issues.warn(path / "ipam", f"passed to {ptype!r} as it is; not checked")
        return
    else:
        canonical = canonical_keys(schema, plugin, path, issues)
        report_schema_errors(
            schema, canonical, path, issues, skip=("name", "cniVersion") if single else ()
        )
        _validate_plugin_semantics(ptype, canonical, path, issues)
        _check_min_version(schema, ptype, list_version, own_version, single, path, issues)
    ipam = plugin.get("ipam")
    if ipam is not None and (not isinstance(ipam, dict) or ipam):
        validate_ipam(ipam, path / "ipam", issues)


def _validate_plugin_semantics(
    ptype: str, plugin: Mapping[str, Any], path: FieldPath, issues: Issues
) -> None:
    if ptype in ("macvlan", "ipvlan", "vlan") and "master" in plugin and plugin["master"] == "":
        issues.error(
            path / "master",
            "must name the parent interface, or be left out to use the "
            "node's default-route interface",
        )
    trunks = plugin.get("vlanTrunk")
    if ptype == "bridge" and isinstance(trunks, list):
        for i, trunk in enumerate(trunks):
            if isinstance(trunk, dict):
                lo, hi = trunk.get("minID"), trunk.get("maxID")
                if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
                    issues.error(
                        path / "vlanTrunk" / i / "minID", f"minID {lo} is greater than maxID {hi}"
                    )
    if ptype == "bandwidth":
        for direction in ("ingress", "egress"):
            rate, burst = plugin.get(f"{direction}Rate"), plugin.get(f"{direction}Burst")
            if bool(rate) != bool(burst):
                issues.error(
                    path / f"{direction}Rate",
                    f"{direction}Rate and {direction}Burst must be set together",
                )


def validate_ipam(ipam: Any, path: FieldPath, issues: Issues) -> None:
    if not isinstance(ipam, dict):
        issues.error(path, f"must be an IPAM object with a type, got {describe(ipam)}")
        return
    if "type" not in ipam:
        issues.error(path / "type", "is required: the IPAM plugin, e.g. host-local, static or dhcp")
        return
    problem = plugin_type_problem(ipam["type"])
    if problem:
        issues.error(path / "type", problem)
        return
    schema = schema_for("ipam", ipam["type"])
    if schema is None:
        issues.warn(
            path / "type",
            f"{ipam['type']!r} is not an IPAM plugin cnidra knows; its fields are not checked",
        )
        return
    before = issues.error_count
    report_schema_errors(schema, ipam, path, issues)
    if issues.error_count > before:
        return  # semantic checks assume well-typed input
    if ipam["type"] == "host-local":
        _validate_host_local(ipam, path, issues)
    elif ipam["type"] == "static":
        _validate_static(ipam, path, issues)


def _validate_host_local(ipam: Mapping[str, Any], path: FieldPath, issues: Issues) -> None:
    if "ranges" in ipam:
        range_sets: list[tuple[FieldPath, list[Mapping[str, Any]]]] = [
            (path / "ranges" / i, rs) for i, rs in enumerate(ipam["ranges"])
        ]
        for key in ("subnet", "rangeStart", "rangeEnd", "gateway"):
            if key in ipam:
                issues.error(path / key, "cannot be combined with ranges: put it inside a range")
    elif "subnet" in ipam:
        range_sets = [(path, [ipam])]
    else:
        issues.error(
            path / "ranges",
            "host-local needs ranges (a list of range sets, each a list "
            "of {subnet, rangeStart, rangeEnd, gateway})",
        )
        return
    located: list[tuple[FieldPath, Network]] = []
    for set_path, range_set in range_sets:
        families: set[int] = set()
        for j, rng in enumerate(range_set):
            rpath = set_path if set_path == path else set_path / j
            net = _check_range(rng, rpath, issues)
            if net is None:
                continue
            families.add(net.version)
            located.append((rpath, net))
        if len(families) > 1:
            issues.error(
                set_path,
                "mixes IPv4 and IPv6 subnets in one range set; put each family "
                "in its own range set",
            )
    for i, j in _overlapping(located):
        (rpath, net), (other_path, other) = located[i], located[j]
        issues.error(
            rpath / "subnet", f"{net} overlaps {other} at {other_path}; ranges must not overlap"
        )
    _validate_routes(ipam.get("routes"), path / "routes", issues)


def _overlapping(located: list[tuple[FieldPath, Network]]) -> list[tuple[int, int]]:
    """(i, j) for each range i that overlaps a range j written before it, j the first such: one
    sort and one sweep per address family, not a comparison of every pair. Two CIDR subnets
    overlap exactly when one holds the other, so in the order of (start, larger first) the
    subnets holding each one are the stack of those still open when it comes; what it holds
    comes after it, before the stack closes it."""
    found: list[tuple[int, int]] = []
    for version in (4, 6):
        spans = sorted(
            (int(net.network_address), net.prefixlen, i, int(net.broadcast_address))
            for i, (_, net) in enumerate(located)
            if net.version == version
        )
        earliest_above: dict[int, int] = {}  # the first-written subnet holding it, or itself
        earliest_below: dict[int, int] = {}  # the first-written subnet it holds, or itself
        stack: list[tuple[int, int]] = []  # (end, index) of the open subnets, outermost first
        for start, _, i, end in spans:
            while stack and stack[-1][0] < start:
                _close(stack, earliest_below)
            above = earliest_above[stack[-1][1]] if stack else i
            earliest_above[i] = min(above, i)
            earliest_below[i] = i
            stack.append((end, i))
        while stack:
            _close(stack, earliest_below)
        for i, above in earliest_above.items():
            # the one it overlaps that was written first: a range is reported once, against
            # a range before it (of two equal ones, the second)
            first = min(above, earliest_below[i])
            if first < i:
                found.append((i, first))
    return sorted(found)


def _close(stack: list[tuple[int, int]], earliest_below: dict[int, int]) -> None:
    """The innermost open subnet is done: what it holds counts for the one holding it."""
    _, i = stack.pop()
    if stack:
        parent = stack[-1][1]
        earliest_below[parent] = min(earliest_below[parent], earliest_below[i])


def _check_range(rng: Mapping[str, Any], path: FieldPath, issues: Issues) -> Network | None:
    iface = parse_interface(rng["subnet"])
    if iface is None:
        return None
    net = iface.network
    if iface.ip != net.network_address:
        issues.error(path / "subnet", f"{rng['subnet']} has host bits set; the network is {net}")
    if net.max_prefixlen - net.prefixlen < 2:
        issues.error(
            path / "subnet",
            f"{net} is too small to allocate from (host-local needs at "
            f"least a /{net.max_prefixlen - 2})",
        )
    bounds: dict[str, ipaddress.IPv4Address | ipaddress.IPv6Address] = {}
    for key in ("rangeStart", "rangeEnd", "gateway"):
        if key in rng:
            addr = parse_ip(rng[key])
            if addr is None:
                continue
            mapped = getattr(addr, "ipv4_mapped", None)
            if mapped is not None and net.version == 4:
                addr = mapped  # ::ffff:a.b.c.d is a.b.c.d to the plugins (Go's net.IP)
            if addr.version != net.version or addr not in net:
                issues.error(path / key, f"{addr} is outside the subnet {net}")
            else:
                bounds[key] = addr
    start, end = bounds.get("rangeStart"), bounds.get("rangeEnd")
    if start is not None and end is not None and int(start) > int(end):
        issues.error(path / "rangeStart", f"rangeStart {start} is after rangeEnd {end}")
    return net


def _validate_static(ipam: Mapping[str, Any], path: FieldPath, issues: Issues) -> None:
    for i, entry in enumerate(ipam.get("addresses") or []):
        iface = parse_interface(entry["address"])
        gateway = parse_ip(entry["gateway"]) if "gateway" in entry else None
        if iface is not None and gateway is not None and gateway.version != iface.version:
            issues.error(
                path / "addresses" / i / "gateway",
                f"{gateway} is IPv{gateway.version} but the address is IPv{iface.version}",
            )
    _validate_routes(ipam.get("routes"), path / "routes", issues)


def _validate_routes(routes: Any, path: FieldPath, issues: Issues) -> None:
    for i, route in enumerate(routes or []):
        dst = parse_interface(route["dst"])
        gw = parse_ip(route["gw"]) if "gw" in route else None
        if dst is not None and gw is not None and gw.version != dst.version:
            issues.error(
                path / i / "gw",
                f"{gw} is IPv{gw.version} but dst {route['dst']} is IPv{dst.version}",
            )


def report_schema_errors(
    schema: PluginSchema,
    instance: Mapping[str, Any],
    path: FieldPath,
    issues: Issues,
    skip: tuple[str, ...] = (),
) -> None:
    for err in sorted(schema.validator.iter_errors(instance), key=lambda e: list(map(str, e.path))):
        where = path.join(err.absolute_path)
        if err.validator == "additionalProperties":
            node: dict[str, Any] = err.schema if isinstance(err.schema, dict) else {}
            props: dict[str, Any] = node.get("properties", {})
            nested = bool(err.absolute_path)
            allowed = sorted(props) if nested else list(schema.own_fields)
            common = (
                ""
                if nested or schema.kind == "ipam"
                else " and the common keys "
                + ", ".join(k for k in props if k not in schema.own_fields)
            )
            instance_keys: list[str] = list(err.instance) if isinstance(err.instance, dict) else []
            extra = [k for k in instance_keys if k not in props]
            for key in extra:
                if key in skip:
                    continue
                what = f"{schema.type} {'IPAM' if schema.kind == 'ipam' else 'plugin'}"
                near = difflib.get_close_matches(key, list(props), n=1, cutoff=0.75)
                hint = f"did you mean {near[0]!r}? " if near else ""
                issues.warn(
                    where / key,
                    f"is not a field of the {what} (release {schema.release}), which ignores "
                    f"it; {hint}known: {', '.join(allowed) or 'none'}{common}",
                )
            continue
        issues.error(where, schema_message(err))


def schema_message(err: ValidationError) -> str:
    value: Any = err.instance
    node: dict[str, Any] = err.schema if isinstance(err.schema, dict) else {}
    match err.validator:
        case "type":
            expected = err.validator_value
            names = {
                "boolean": "a boolean (true or false)",
                "integer": "an integer",
                "string": "a string",
                "object": "an object",
                "array": "a list",
                "number": "a number",
            }
            want = (
                names.get(expected, str(expected)) if isinstance(expected, str) else str(expected)
            )
            hint = ""
            if expected in ("integer", "boolean") and isinstance(value, str):
                hint = " (remove the quotes)" if _looks_like(expected, value) else ""
            return f"must be {want}, got {describe(value)}{hint}"
        case "enum":
            options: list[Any] = (
                list(err.validator_value) if isinstance(err.validator_value, list) else []
            )
            allowed = ", ".join(repr(v) for v in options)
            return f"{describe(value)} is not allowed; allowed: {allowed}"
        case "minimum" | "maximum":
            lo = node.get("minimum")
            hi = node.get("maximum")
            if lo is not None and hi is not None:
                return f"{value} is out of range; allowed: {lo} to {hi}"
            bound = f"at least {lo}" if lo is not None else f"at most {hi}"
            return f"{value} is out of range; must be {bound}"
        case "format":
            hint = FORMAT_HINTS.get(str(err.validator_value), "has the wrong format")
            return f"{describe(value)}: {hint}"
        case "required":
            return err.message.replace("is a required property", "is required")
        case "minItems":
            return f"must have at least {err.validator_value} item(s), got {len(value)}"
        case "pattern":
            return f"{describe(value)} does not have the expected form ({err.validator_value})"
        case _:
            return f"{json_type(value)} value rejected: {err.message}"


def _looks_like(expected: str, value: str) -> bool:
    if expected == "integer":
        return value.strip().lstrip("-").isdigit()
    return value.lower() in ("true", "false")
