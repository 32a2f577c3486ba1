"""Named networks: a CNIConfig may reference a network instead of embedding one. Pure: the
objects and files are read by the callers (prepare, `cnidra validate`) and handed in.

Three kinds of reference (`CNIConfig.network`, exactly one key):

- `name`: a **CNINetwork**, cluster-scoped, written by the admin (DANM's ClusterNetwork): a
  full CNI config or a node-local `networkID`, routes, an interface name prefix, and which
  namespaces may use it. Its config is the admin's, like a DeviceClass's.
- `networkID`: the node-local conf `<conf dir>/<networkID>.conflist` (or `.conf`), read on the
  node where the pod lands, so one network can mean `eno1` on one node and `ens2f0` on another.
  Only the admin's: a DeviceClass may name one, a claim may not (the conf directory holds the
  primary network's own file too).
- `attachmentDefinition`: a Multus NetworkAttachmentDefinition (`name` or `namespace/name`),
  used as it is. A NAD is written by whoever may create them in its namespace, so its config is
  checked like a claim's own network (the class's CNIPolicy); a NAD outside the claim's
  namespace is usable only where the class's CNIPolicy lists that namespace.

Each reference becomes an ordinary config entry (`expand_network`): from then on a named network
goes through the same policy, merge, validation and binding as an embedded one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cnidra.api.constants import API_GROUP, API_VERSION
from cnidra.api.issues import FieldPath, Issues, describe
from cnidra.api.loading import LoadError, load_json
from cnidra.api.merge import ConfigEntry, Source, applicable, last_set, provenance
from cnidra.api.netconf import to_conflist
from cnidra.api.parameters import bounds_problem
from cnidra.api.policy import LabelSelector, governing_policy, is_policy

NETWORK_KIND = "CNINetwork"
NETWORK_PLURAL = "cninetworks"
NAD_KIND = "NetworkAttachmentDefinition"
NAD_GROUP = "k8s.cni.cncf.io"
NAD_API_VERSION = f"{NAD_GROUP}/v1"
NAD_RESOURCE_ANNOTATION = "k8s.v1.cni.cncf.io/resourceName"
# a file name in the conf directory, without its extension; never a path
_NETWORK_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$")
_OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
CONF_EXTENSIONS = (".conflist", ".conf", ".json")


def network_id_problem(value: str) -> str | None:
    if not _NETWORK_ID.match(value) or ".." in value:
        return (
            f"{value!r} is not a NetworkID: a file name in the CNI conf directory without its "
            "extension (letters, digits, '_', '.', '-'; at most 100; no '/')"
        )
    return None


def _object_name(value: str) -> bool:
    return len(value) <= 253 and bool(_OBJECT_NAME.match(value))


class NetworkRef(BaseModel):
    """`CNIConfig.network`: which named network, exactly one key."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    name: str | None = None
    network_id: str | None = Field(default=None, alias="networkID")
    attachment_definition: str | None = Field(default=None, alias="attachmentDefinition")

    @model_validator(mode="after")
    def _exactly_one(self) -> NetworkRef:
        given = [v for v in (self.name, self.network_id, self.attachment_definition) if v]
        if len(given) != 1:
            raise ValueError(
                "must set exactly one of name (a CNINetwork), networkID (a node-local conf) "
                "or attachmentDefinition (a NetworkAttachmentDefinition, [namespace/]name)"
            )
        if self.name is not None and not _object_name(self.name):
            raise ValueError(f"name {self.name!r} is not a Kubernetes object name")
        if self.network_id is not None:
            problem = network_id_problem(self.network_id)
            if problem:
                raise ValueError(problem)
        if self.attachment_definition is not None:
            namespace, _, name = self.attachment_definition.rpartition("/")
            if (namespace and not _NAMESPACE.match(namespace)) or not _object_name(name):
                raise ValueError(
                    f"attachmentDefinition {self.attachment_definition!r} must be a "
                    "NetworkAttachmentDefinition's name or namespace/name"
                )
        return self

    def nad(self, claim_namespace: str) -> tuple[str, str]:
        assert self.attachment_definition is not None
        namespace, _, name = self.attachment_definition.rpartition("/")
        return namespace or claim_namespace, name

    def describe(self, claim_namespace: str) -> str:
        if self.name:
            return f"{NETWORK_KIND} {self.name}"
        if self.network_id:
            return f"node conf {self.network_id}"
        namespace, name = self.nad(claim_namespace)
        return f"{NAD_KIND} {namespace}/{name}"


class Route(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    dst: str
    gw: str | None = None


class CNINetworkSpec(BaseModel):
    """A CNINetwork's spec (cluster-scoped, group cni.networking.x-k8s.io)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # DANM's NetworkType: the plugin binary; the config's (first) plugin must be of this type
    type: str | None = None
    config: dict[str, Any] | str | None = None
    network_id: str | None = Field(default=None, alias="networkID")
    routes: list[Route] = Field(default_factory=list)
    if_name_prefix: str | None = Field(default=None, alias="ifNamePrefix")
    namespaces: list[str] | None = None
    namespace_selector: LabelSelector | None = Field(default=None, alias="namespaceSelector")

    @model_validator(mode="after")
    def _one_source(self) -> CNINetworkSpec:
        if (self.config is None) == (self.network_id is None):
            raise ValueError(
                "must set exactly one of config (the CNI network configuration) or networkID "
                "(a conf file in the CNI conf directory of each node)"
            )
        if self.network_id is not None:
            problem = network_id_problem(self.network_id)
            if problem:
                raise ValueError(problem)
        return self


@dataclass(frozen=True)
class NamedNetwork:
    """A referenced network, read and parsed: what replaces the reference."""

    reference: str  # for messages: "CNINetwork data-a"
    config: Mapping[str, Any]  # the conflist, as plugins will see it (before cnidra names it)
    path: FieldPath  # where its `config` lives, for messages
    trusted: bool  # the admin's: locked like a DeviceClass's config
    if_name_prefix: str | None = None
    routes: tuple[Route, ...] = ()
    namespaces: tuple[str, ...] | None = None
    namespace_selector: LabelSelector | None = None
    # the name readers of Multus' network-status annotation know it by
    status_name: str = ""
    network_id: str | None = None
    # a NetworkAttachmentDefinition's namespace: the network runs under a name of that
    # namespace (cnidra.api.ownership), so two namespaces' `blue` never share a pool
    owner_namespace: str | None = None

    def admits(self, namespace: str, labels: Mapping[str, str] | None) -> str | None:
        """Why `namespace` may not use this network; None when it may."""
        if self.namespaces is not None and namespace not in self.namespaces:
            allowed = ", ".join(self.namespaces) or "none"
            return f"{self.reference} may be used from namespaces {allowed}, not {namespace}"
        if self.namespace_selector is not None:
            if labels is None:
                return (
                    f"{self.reference} selects namespaces by label, and {namespace}'s are unknown"
                )
            if not self.namespace_selector.matches(labels):
                return f"{self.reference}'s namespaceSelector does not select {namespace}"
        return None


@dataclass(frozen=True)
class Unresolved:
    """A reference that could not be read; `offline` when nobody tried (validate without the
    objects), which is a warning, not an error."""

    message: str
    offline: bool = False


class NetworkCatalog(Protocol):
    def lookup(self, ref: NetworkRef, claim_namespace: str) -> NamedNetwork | Unresolved: ...


@dataclass
class StaticCatalog:
    """Networks read beforehand (prepare) or given as documents (`cnidra validate`)."""

    networks: dict[str, NamedNetwork | Unresolved] = field(default_factory=dict)
    offline: bool = False

    @staticmethod
    def key(ref: NetworkRef, claim_namespace: str) -> str:
        return ref.describe(claim_namespace)

    def lookup(self, ref: NetworkRef, claim_namespace: str) -> NamedNetwork | Unresolved:
        found = self.networks.get(self.key(ref, claim_namespace))
        if found is not None:
            return found
        what = ref.describe(claim_namespace)
        if self.offline:
            return Unresolved(f"{what} is not in the input, so it is not checked", offline=True)
        return Unresolved(f"{what} was not found")


# ------------------------------------------------------------------- reading the objects


def cninetwork(
    obj: Mapping[str, Any], conf: NamedNetwork | Unresolved | None = None
) -> NamedNetwork | Unresolved:
    """A CNINetwork object; `conf` is its node-local conf when it names a networkID (read by the
    caller from the node's conf directory)."""
    meta = obj.get("metadata")
    name = str((meta if isinstance(meta, dict) else {}).get("name") or "?")
    where = FieldPath((f"{NETWORK_KIND} {name}", "spec"))
    try:
        spec = CNINetworkSpec.model_validate(obj.get("spec") or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        return Unresolved(
            f"{NETWORK_KIND} {name} is invalid: spec.{loc}: {first['msg']}".rstrip(": ")
        )
    if spec.network_id is not None:
        if conf is None:
            return Unresolved(f"{NETWORK_KIND} {name}: node conf {spec.network_id} was not read")
        if isinstance(conf, Unresolved):
            return Unresolved(f"{NETWORK_KIND} {name}: {conf.message}", conf.offline)
        config: Mapping[str, Any] = conf.config
        path = conf.path
    else:
        parsed = _conflist(spec.config, f"{NETWORK_KIND} {name} spec.config", name)
        if isinstance(parsed, Unresolved):
            return parsed
        config, path = parsed, where
    if spec.type is not None:
        first_type = next(iter(p.get("type") for p in config.get("plugins") or []), None)
        if first_type != spec.type:
            return Unresolved(
                f"{NETWORK_KIND} {name} has type {spec.type!r}, but its config's first plugin "
                f"is {first_type!r}"
            )
    return NamedNetwork(
        reference=f"{NETWORK_KIND} {name}",
        config=with_routes(config, spec.routes),
        path=path,
        trusted=True,
        if_name_prefix=spec.if_name_prefix,
        routes=tuple(spec.routes),
        namespaces=tuple(spec.namespaces) if spec.namespaces is not None else None,
        namespace_selector=spec.namespace_selector,
        status_name=name,
        network_id=spec.network_id,
    )


def node_conf(
    network_id: str, files: Mapping[str, bytes | None], conf_dir: str
) -> NamedNetwork | Unresolved:
    """The conf `<conf_dir>/<network_id>.{conflist,conf,json}`; `files` maps each candidate
    file name to its bytes (None: absent), read by the caller."""
    problem = network_id_problem(network_id)
    if problem:
        return Unresolved(problem)
    for ext in CONF_EXTENSIONS:
        data = files.get(network_id + ext)
        if data is None:
            continue
        path = f"{conf_dir}/{network_id}{ext}"
        config = _conflist(data, f"node conf {path}", network_id)
        if isinstance(config, Unresolved):
            return Unresolved(f"node conf {path} is unreadable: {config.message}")
        return NamedNetwork(
            reference=f"node conf {network_id}",
            config=config,
            path=FieldPath((path,)),
            trusted=True,
            status_name=str(config.get("name") or network_id),
            network_id=network_id,
        )
    names = ", ".join(f"{network_id}{ext}" for ext in CONF_EXTENSIONS)
    return Unresolved(f"node conf {network_id} is not on this node: none of {names} in {conf_dir}")


def nad(obj: Mapping[str, Any], trusted: bool) -> NamedNetwork | Unresolved:
    """A NetworkAttachmentDefinition used as it is: its `spec.config` JSON (the NAD's name when
    the config has none, as the multi-net spec says)."""
    meta = obj.get("metadata") or {}
    ref = f"{NAD_KIND} {meta.get('namespace')}/{meta.get('name')}"
    spec = obj.get("spec") or {}
    raw = spec.get("config") if isinstance(spec, Mapping) else None
    if not raw:
        annotations = meta.get("annotations")
        resource = (annotations if isinstance(annotations, dict) else {}).get(
            NAD_RESOURCE_ANNOTATION
        )
        why = f"names only the device resource {resource!r}" if resource else "has no spec.config"
        return Unresolved(
            f"{ref} {why}: Multus reads such a NAD's config from a file on each node, which "
            "cnidra does not; reference the file by networkID through a CNINetwork instead"
        )
    if not isinstance(raw, str):
        return Unresolved(f"{ref} spec.config must be a string of JSON, got {describe(raw)}")
    config = _conflist(raw, f"{ref} spec.config", str(meta.get("name")))
    if isinstance(config, Unresolved):
        return config
    return NamedNetwork(
        reference=ref,
        config=config,
        path=FieldPath((ref, "spec")),
        trusted=trusted,
        status_name=f"{meta.get('namespace')}/{meta.get('name')}",
        owner_namespace=str(meta.get("namespace")),
    )


def _conflist(raw: Any, what: str, default_name: str) -> dict[str, Any] | Unresolved:
    """A config given as an object or as JSON text, as a conflist; named after its object when
    it has no name (the multi-net spec's rule for NADs)."""
    if isinstance(raw, str | bytes):
        try:
            raw = load_json(raw, what)
        except LoadError as exc:
            return Unresolved(str(exc))
    if not isinstance(raw, dict):
        return Unresolved(f"{what} must hold a JSON object, got {describe(raw)}")
    # the one set of bounds, as for a config written in a claim (it takes its place there),
    # checked once per network rather than by each request that references it
    problem = bounds_problem({"config": raw})
    if problem:
        return Unresolved(f"{what} {problem}")
    return to_conflist(raw if "name" in raw else {"name": default_name, **raw})


def with_routes(config: Mapping[str, Any], routes: Sequence[Route]) -> Mapping[str, Any]:
    """The network with a CNINetwork's routes added to the IPAM of each plugin that has one."""
    if not routes:
        return config
    extra = [r.model_dump(exclude_none=True) for r in routes]
    plugins = []
    for plugin in config.get("plugins") or []:
        ipam = plugin.get("ipam") if isinstance(plugin, Mapping) else None
        if isinstance(ipam, Mapping) and ipam.get("type"):
            merged = [*(ipam.get("routes") or []), *extra]
            plugins.append({**plugin, "ipam": {**ipam, "routes": merged}})
        else:
            plugins.append(plugin)
    return {**config, "plugins": plugins}


# ------------------------------------------------------------------- references to entries


@dataclass
class Expansion:
    """The request's entries with its reference replaced by the network's config."""

    entries: list[ConfigEntry]
    network: NamedNetwork | None = None
    skipped: bool = False  # offline: the reference could not be checked (a warning says so)


def reference_of(entries: Sequence[ConfigEntry], request: str) -> tuple[Any, FieldPath] | None:
    chosen = [e for e in applicable(entries, request) if not is_policy(e.parameters)]
    return _reference(chosen)


def _reference(chosen: Sequence[ConfigEntry]) -> tuple[Any, FieldPath] | None:
    """The merged `network` of `chosen` and where it was set (no config is merged for it)."""
    value = last_set(chosen, "network")
    if value is None:
        return None
    return value, provenance(chosen, "network") or FieldPath()


def expand_network(
    entries: Sequence[ConfigEntry],
    request: str,
    namespace: str,
    labels: Mapping[str, str] | None,
    catalog: NetworkCatalog | None,
    issues: Issues,
    where: FieldPath,
    device_network: NamedNetwork | None = None,
) -> Expansion:
    """Replace the request's `network` reference (or the network its allocated device stands
    for, `device_network`) by a config entry. Errors name the reference and what is allowed."""
    chosen = [e for e in applicable(entries, request) if not is_policy(e.parameters)]
    found = _reference(chosen)
    has_config = last_set(chosen, "config") is not None
    if found is None and device_network is None:
        return Expansion(list(entries))
    stripped = [_without_network(e, request) for e in entries]
    if found is None:
        assert device_network is not None
        if has_config:
            origin = provenance(chosen, "config") or where
            issues.error(
                origin,
                f"the scheduler allocated a device of {device_network.reference}, which is "
                "the network; a config may not define another one",
            )
            return Expansion(list(entries))
        return _expanded(
            stripped, request, device_network, Source.CLASS, namespace, labels, issues, where
        )
    value, path = found
    source = _source_of(chosen, path)
    try:
        ref = NetworkRef.model_validate(value)
    except ValidationError as exc:
        issues.error(
            path, "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        )
        return Expansion(list(entries))
    if has_config:
        issues.error(
            path,
            f"references {ref.describe(namespace)}, and a config of the request also sets "
            "config; a request either embeds its network or references one",
        )
        return Expansion(list(entries))
    if source is Source.CLAIM and ref.network_id is not None:
        issues.error(
            path / "networkID",
            "a claim may not name a node conf: the CNI conf directory holds the node's own "
            "networks; reference a CNINetwork that uses it (network.name), or use a "
            "DeviceClass that names it",
        )
        return Expansion(list(entries))
    if (
        source is Source.CLASS
        and ref.attachment_definition is not None
        and "/" not in ref.attachment_definition
    ):
        issues.error(
            path / "attachmentDefinition",
            f"{ref.attachment_definition!r} has no namespace: a DeviceClass serves every "
            "namespace, so the NetworkAttachmentDefinition it names must be given as "
            "namespace/name (without one it would be read from each tenant's own namespace "
            "and trusted as the admin's)",
        )
        return Expansion(list(entries))
    if source is Source.CLAIM and ref.attachment_definition is not None:
        nad_namespace, _ = ref.nad(namespace)
        if nad_namespace != namespace and not _nad_namespace_allowed(
            entries, request, namespace, labels, nad_namespace
        ):
            issues.error(
                path / "attachmentDefinition",
                f"{ref.describe(namespace)} is in another namespace than the claim "
                f"({namespace}); the DeviceClass's CNIPolicy must list {nad_namespace} in "
                "claims.attachmentDefinitionNamespaces",
            )
            return Expansion(list(entries))
    if device_network is not None:
        if ref.name is None or device_network.reference != f"{NETWORK_KIND} {ref.name}":
            issues.error(
                path,
                f"references {ref.describe(namespace)}, but the scheduler allocated a device of "
                f"{device_network.reference}; select the device of the network referenced",
            )
            return Expansion(list(entries))
        network: NamedNetwork | Unresolved = device_network
    elif catalog is None:
        network = Unresolved(f"{ref.describe(namespace)} cannot be read here", offline=True)
    else:
        network = catalog.lookup(ref, namespace)
    if isinstance(network, Unresolved):
        if network.offline:
            issues.warn(path, network.message)
            return Expansion(stripped, skipped=True)
        issues.error(path, network.message)
        return Expansion(list(entries))
    # a NAD the claim names is its namespace's (tenant input); one the class names is the admin's
    trusted = network.trusted or source is Source.CLASS
    return _expanded(
        stripped,
        request,
        network,
        Source.CLASS if trusted else Source.CLAIM,
        namespace,
        labels,
        issues,
        path,
    )


def _expanded(
    stripped: list[ConfigEntry],
    request: str,
    network: NamedNetwork,
    source: Source,
    namespace: str,
    labels: Mapping[str, str] | None,
    issues: Issues,
    path: FieldPath,
) -> Expansion:
    refused = network.admits(namespace, labels)
    if refused:
        issues.error(path, refused)
        return Expansion(stripped)
    params: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "CNIConfig",
        "config": dict(network.config),
    }
    if network.if_name_prefix:
        params["ifNamePrefix"] = network.if_name_prefix
    entry = ConfigEntry(source, params, (request,), network.path)
    # the network's entry first: what the class and the claim set (ifName) applies on top
    return Expansion([entry, *stripped], network)


def _without_network(entry: ConfigEntry, request: str) -> ConfigEntry:
    if "network" not in entry.parameters or not entry.applies_to(request):
        return entry
    params = {k: v for k, v in entry.parameters.items() if k != "network"}
    return ConfigEntry(entry.source, params, entry.requests, entry.path)


def _source_of(chosen: Sequence[ConfigEntry], path: FieldPath) -> Source:
    for entry in chosen:
        if path.segments[: len(entry.path.segments)] == entry.path.segments:
            return entry.source
    return Source.CLAIM


def _nad_namespace_allowed(
    entries: Sequence[ConfigEntry],
    request: str,
    namespace: str,
    labels: Mapping[str, str] | None,
    nad_namespace: str,
) -> bool:
    class_entries = [e for e in applicable(entries, request) if e.source is Source.CLASS]
    verdict = governing_policy(class_entries, namespace, labels, Issues())
    if not verdict.covered or verdict.policy is None:
        return False
    return nad_namespace in verdict.policy.claims.attachment_definition_namespaces


# ------------------------------------------------------------------- CRD


def crd() -> dict[str, Any]:
    """The CNINetwork CustomResourceDefinition (deploy/ and the chart render it)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{NETWORK_PLURAL}.{API_GROUP}"},
        "spec": {
            "group": API_GROUP,
            "scope": "Cluster",
            "names": {
                "kind": NETWORK_KIND,
                "plural": NETWORK_PLURAL,
                "singular": NETWORK_KIND.lower(),
                "shortNames": ["cninet"],
            },
            "versions": [
                {
                    "name": API_VERSION.split("/")[1],
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": _schema()},
                    "additionalPrinterColumns": [
                        {"name": "Type", "type": "string", "jsonPath": ".spec.type"},
                        {"name": "NetworkID", "type": "string", "jsonPath": ".spec.networkID"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                }
            ],
        },
    }


def _schema() -> dict[str, Any]:
    selector = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "maxLength": 64},
                    "config": {"x-kubernetes-preserve-unknown-fields": True},
                    "networkID": {
                        "type": "string",
                        "maxLength": 100,
                        "pattern": _NETWORK_ID.pattern,
                    },
                    "routes": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["dst"],
                            "properties": {"dst": {"type": "string"}, "gw": {"type": "string"}},
                        },
                    },
                    "ifNamePrefix": {"type": "string", "maxLength": 12},
                    "namespaces": {"type": "array", "items": {"type": "string"}},
                    "namespaceSelector": selector,
                },
            }
        },
    }
