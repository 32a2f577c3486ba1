"""A CNIConfig's parameters (an opaque config of cnidra's driver) parsed and checked: the
typed model, the cross-field checks, pydantic's complaints told at the field's path. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from cnidra.api.constants import (
    API_VERSION,
    KIND,
    LEGACY_KIND,
)
from cnidra.api.ipam import cnidra_ipam
from cnidra.api.issues import FieldPath, Issues, describe
from cnidra.api.naming import prefix_problem
from cnidra.api.netconf import to_conflist, validate_network_config
from cnidra.api.parameters import read_parameters
from cnidra.api.plugin_schema import ifname_problem
from cnidra.api.types import CNICONFIG_FIELDS, CNIConfig

KNOWN_CAPABILITIES = ("portMappings", "bandwidth", "ips", "mac", "dns", "infinibandGUID")


# ---------------------------------------------------------------- CNIConfig parameters


def parse_parameters(
    params: Any, path: FieldPath, issues: Issues, *, complete: bool, network: bool = True
) -> CNIConfig | None:
    """Check one CNIConfig object; None when it has errors. `network` False leaves its CNI
    config to a later check (a claim's, checked once merged with its class's)."""
    before = issues.error_count
    params = read_parameters(params, path, issues)
    if params is None:
        return None
    if not isinstance(params, dict):
        issues.error(path, f"must be a {KIND} object, got {describe(params)}")
        return None
    if params.get("kind") == LEGACY_KIND:
        issues.warn(path / "kind", f"kind {LEGACY_KIND!r} is deprecated; use {KIND!r}")
    try:
        model: CNIConfig | None = CNIConfig.model_validate(_without(params, "config"))
    except ValidationError as exc:
        _report_pydantic(exc, path, issues)
        model = None
    if "apiVersion" not in params:
        issues.error(path / "apiVersion", f"is required: {API_VERSION}")
    if "kind" not in params:
        issues.error(path / "kind", f"is required: {KIND}")
    if_name = params.get("ifName")
    if isinstance(if_name, str):
        problem = ifname_problem(if_name)
        if problem:
            issues.error(path / "ifName", f"{if_name!r} {problem}" if if_name else problem)
    prefix = params.get("ifNamePrefix")
    if isinstance(prefix, str):
        problem = prefix_problem(prefix)
        if problem:
            issues.error(path / "ifNamePrefix", problem)
    config = params.get("config")
    if config is not None and params.get("network") is not None:
        issues.error(
            path / "network",
            "a CNIConfig either embeds its network (config) or references one (network), not both",
        )
    if config is not None and network:
        validate_network_config(config, path / "config", issues, complete=complete)
    elif (
        complete
        and config is None
        and params.get("network") is None
        and not _has_error_at(issues, path / "config")
    ):
        issues.error(
            path / "config",
            "is required: a CNI network configuration (conf or conflist), or a named network "
            "in network",
        )
    if isinstance(config, dict):
        _cross_check(params, config, path, issues)
    if issues.error_count > before or model is None:
        return None
    if isinstance(config, dict):
        return model.model_copy(update={"config": config})
    return model


def _without(params: Mapping[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in params.items() if k != key}


def _has_error_at(issues: Issues, path: FieldPath) -> bool:
    return any(i.path == path for i in issues.errors)


def _cross_check(
    params: Mapping[str, Any], config: Mapping[str, Any], path: FieldPath, issues: Issues
) -> None:
    uses_pool = cnidra_ipam(to_conflist(config))
    if len(uses_pool) > 1:
        issues.error(
            path / "config",
            f"{len(uses_pool)} plugins ask for cnidra IPAM (ipam.type cnidra); one network gets "
            "one set of addresses, so one plugin may",
        )
    if uses_pool:
        _no_other_addresses(params, config, path, issues)
    if params.get("ipamClaimReference") and not uses_pool:
        issues.warn(
            path / "ipamClaimReference",
            "is ignored: only a network whose IPAM is cnidra's (ipam: {type: cnidra, pool: ...}, "
            "a CNIIPPool with allowPersistentIPs) keeps addresses in an IPAMClaim",
        )
    caps = params.get("capabilities")
    if isinstance(caps, dict) and caps:
        plugins = to_conflist(config).get("plugins")
        declared: set[str] = set()
        for plugin in plugins if isinstance(plugins, list) else []:
            pcaps = plugin.get("capabilities") if isinstance(plugin, dict) else None
            if isinstance(pcaps, dict):
                declared |= {k for k, v in pcaps.items() if v is True}
        for cap in caps:
            if cap in KNOWN_CAPABILITIES and cap not in declared:
                issues.error(
                    path / "capabilities" / cap,
                    f"is set but no plugin in config declares capabilities: {{{cap}: true}}, "
                    "so no plugin would receive it",
                )
        if isinstance(caps.get("ips"), list) and params.get("ipamClaimReference"):
            issues.error(
                path / "ipamClaimReference",
                "cannot be combined with capabilities.ips: the IPAMClaim decides the addresses",
            )


def _no_other_addresses(
    params: Mapping[str, Any], config: Mapping[str, Any], path: FieldPath, issues: Issues
) -> None:
    """cnidra IPAM's addresses are the pool's: prepare hands them to the static plugin, which
    would let CNI_ARGS IP, args.cni.ips or runtimeConfig ips replace them."""
    why = (
        "would replace the addresses cnidra IPAM gives from the pool (the static plugin reads "
        "it over its own); a network with cnidra IPAM takes its addresses from the pool only"
    )
    args = params.get("args")
    for key in ("IP", "GATEWAY"):
        if isinstance(args, Mapping) and key in args:
            issues.error(path / "args" / key, why)
    caps = params.get("capabilities")
    if isinstance(caps, Mapping) and "ips" in caps:
        issues.error(path / "capabilities" / "ips", why)
    plugins = config.get("plugins") if "plugins" in config else [config]
    for i, plugin in enumerate(plugins if isinstance(plugins, list) else []):
        pargs = plugin.get("args") if isinstance(plugin, Mapping) else None
        cni = pargs.get("cni") if isinstance(pargs, Mapping) else None
        if isinstance(cni, Mapping) and "ips" in cni:
            where = path / "config" / "plugins" / i if "plugins" in config else path / "config"
            issues.error(where / "args" / "cni" / "ips", why)


def _report_pydantic(exc: ValidationError, path: FieldPath, issues: Issues) -> None:
    for err in exc.errors():
        loc = path.join(err["loc"])
        kind, value = err["type"], err.get("input")
        if kind == "extra_forbidden":
            allowed = CNICONFIG_FIELDS if len(err["loc"]) == 1 else None
            hint = f"; allowed: {', '.join(allowed)}" if allowed else ""
            issues.error(loc, f"unknown field{hint}")
        elif kind == "literal_error" and err["loc"] == ("apiVersion",):
            issues.error(loc, f"must be {API_VERSION}, got {describe(value)}")
        elif kind == "literal_error" and err["loc"] == ("kind",):
            issues.error(loc, f"must be {KIND}, got {describe(value)}")
        elif kind == "missing":
            issues.error(loc, "is required")
        elif kind == "value_error":
            issues.error(loc, str(err["msg"]).removeprefix("Value error, "))
        else:
            issues.error(loc, f"{err['msg'][0].lower()}{err['msg'][1:]}, got {describe(value)}")
