"""Turn the CNI files people already have (.conf, .conflist, Multus NetworkAttachmentDefinition)
into CNIConfig-carrying Kubernetes objects. Pure: text in, objects out."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import yaml

from cnidra.api.constants import API_VERSION, DEVICE_CLASS_NAME, DRIVER_NAME, KIND
from cnidra.api.loading import LoadError, load_json, load_yaml
from cnidra.api.netconf import to_conflist
from cnidra.api.policy import parent_links


class OutputKind(StrEnum):
    TEMPLATE = "ResourceClaimTemplate"
    CLAIM = "ResourceClaim"
    CNICONFIG = "CNIConfig"


class ConvertError(ValueError):
    pass


@dataclass(frozen=True)
class Source:
    config: dict[str, Any]
    name: str | None = None
    namespace: str | None = None
    from_nad: bool = False


NAD_KIND = "NetworkAttachmentDefinition"


def read_sources(data: str | bytes, name: str = "input") -> list[Source]:
    """The CNI configs in a file: a `.conf`/`.conflist` (strict JSON, as libcni reads it), or
    every NetworkAttachmentDefinition of a (multi-document) YAML or JSON file, other kinds
    (the Pods of an example, say) skipped."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    raw = data if isinstance(data, bytes) else data.encode()
    json_file = text.lstrip().startswith("{")
    try:
        docs = [load_json(raw, name)] if json_file else load_yaml(raw, name)
    except LoadError as exc:
        raise ConvertError(str(exc)) from None
    if not docs:
        raise ConvertError(f"{name} is empty")
    single = docs[0] if len(docs) == 1 and isinstance(docs[0], dict) else None
    if single is not None and "kind" not in single:
        doc = single
        if "plugins" not in doc and "type" not in doc:
            raise ConvertError(
                "not a CNI config: it has neither plugins (conflist) nor type (conf), "
                "nor is it a NetworkAttachmentDefinition"
            )
        if not json_file:
            raise ConvertError("a CNI config file is JSON (libcni reads nothing else), not YAML")
        return [Source(doc, doc.get("name") if isinstance(doc.get("name"), str) else None)]
    nads = [d for d in docs if isinstance(d, dict) and d.get("kind") == NAD_KIND]
    if not nads:
        kinds = ", ".join(sorted({str(d.get("kind")) for d in docs if isinstance(d, dict)}))
        found = kinds or "none"
        raise ConvertError(
            f"expected a CNI config object or a NetworkAttachmentDefinition; found {found}"
        )
    return [_from_nad(nad) for nad in nads]


def read_source(text: str | bytes) -> Source:
    """The first (usually only) config of `read_sources`."""
    return read_sources(text)[0]


def _from_nad(nad: dict[str, Any]) -> Source:
    meta = nad.get("metadata")
    spec = nad.get("spec")
    if not isinstance(meta, dict):
        raise ConvertError("NetworkAttachmentDefinition metadata must be an object")
    if spec is not None and not isinstance(spec, dict):
        raise ConvertError("NetworkAttachmentDefinition spec must be an object")
    name = meta.get("name")
    raw = (spec or {}).get("config")
    if not isinstance(raw, str):
        resource = (meta.get("annotations") or {}).get("k8s.v1.cni.cncf.io/resourceName")
        why = f" (it names only the resource {resource})" if resource else ""
        raise ConvertError(
            f"NetworkAttachmentDefinition {name} has no spec.config string{why}: its config "
            "lives in a file on each node, which cannot be converted from the NAD alone"
        )
    try:
        config = load_json(raw, "spec.config")
    except LoadError as exc:
        raise ConvertError(str(exc)) from None
    if not isinstance(config, dict):
        raise ConvertError("spec.config must hold a JSON object")
    if "name" not in config and isinstance(name, str):
        config = {"name": name, **config}  # the multi-net spec injects the NAD name
    namespace = meta.get("namespace")
    return Source(
        config,
        name if isinstance(name, str) else None,
        namespace if isinstance(namespace, str) else None,
        from_nad=True,
    )


def dns_label(text: str, fallback: str = "network") -> str:
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:63].strip("-")
    return label or fallback


def to_document(
    source: Source,
    kind: OutputKind = OutputKind.TEMPLATE,
    name: str | None = None,
    if_name: str = "net1",
    reference: bool = False,
) -> dict[str, Any]:
    """`reference`: a claim that references the NAD (used as it is) instead of embedding a
    copy of its config. A network naming its parent link selects that link, so the scheduler
    allocates the link the config names."""
    if reference and not (source.from_nad and source.name):
        raise ConvertError("only a NetworkAttachmentDefinition can be referenced")
    base = dns_label(name or source.name or "network")
    params: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND, "ifName": if_name}
    if reference:
        params["network"] = {"attachmentDefinition": source.name}
    else:
        params["config"] = source.config
    if kind is OutputKind.CNICONFIG:
        return params
    request = base
    exactly: dict[str, Any] = {"deviceClassName": DEVICE_CLASS_NAME}
    parent = _parent(source.config)
    if parent:
        selector = f'device.attributes["{DRIVER_NAME}"].ifName == "{parent}"'
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    devices = {
        "requests": [{"name": request, "exactly": exactly}],
        "config": [
            {"requests": [request], "opaque": {"driver": DRIVER_NAME, "parameters": params}}
        ],
    }
    metadata: dict[str, Any] = {"name": base}
    if source.namespace:
        metadata["namespace"] = source.namespace
    spec = {"spec": {"devices": devices}} if kind is OutputKind.TEMPLATE else {"devices": devices}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": str(kind),
        "metadata": metadata,
        "spec": spec,
    }


def _parent(config: Mapping[str, Any]) -> str | None:
    """The link a selector can name (a link name, not a template or an odd string)."""
    for link in parent_links(to_conflist(config)):
        if re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", link):
            return link
    return None


class _Dumper(yaml.SafeDumper):
    """PyYAML folds NEL/LS/PS inside single-quoted scalars; such strings go double-quoted."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = '"' if any(c in value for c in _UNICODE_BREAKS) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_UNICODE_BREAKS = ("\x85", "\u2028", "\u2029")
_Dumper.add_representer(str, _represent_str)


def render_yaml(doc: Any) -> str:
    return yaml.dump(
        doc,
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=100,
    )


def extract_config(doc: Any) -> Any:
    """The CNI config inside a converted document (for round-trip checks)."""
    if doc.get("kind") == KIND:
        return doc["config"]
    spec = doc["spec"]["spec"] if doc["kind"] == OutputKind.TEMPLATE else doc["spec"]
    return spec["devices"]["config"][0]["opaque"]["parameters"]["config"]
