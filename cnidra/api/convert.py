"""Turn the CNI files people already have (.conf, .conflist, Multus NetworkAttachmentDefinition)
into CNIConfig-carrying Kubernetes objects. Pure: text in, objects out."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import yaml

from cnidra.api.constants import API_VERSION, DEVICE_CLASS_NAME, DRIVER_NAME, KIND


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


def read_source(text: str) -> Source:
    """Parse a .conf/.conflist JSON file or a NetworkAttachmentDefinition YAML."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as json_exc:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError:
            raise ConvertError(
                f"neither JSON nor YAML: {json_exc.msg} at line {json_exc.lineno} "
                f"column {json_exc.colno}"
            ) from None
    if not isinstance(data, dict):
        raise ConvertError("expected a CNI config object or a NetworkAttachmentDefinition")
    if data.get("kind") == "NetworkAttachmentDefinition":
        return _from_nad(data)
    if "plugins" not in data and "type" not in data:
        raise ConvertError("not a CNI config: it has neither plugins (conflist) nor type (conf)")
    return Source(data, data.get("name") if isinstance(data.get("name"), str) else None)


def _from_nad(nad: dict[str, Any]) -> Source:
    meta = nad.get("metadata") or {}
    name = meta.get("name")
    raw = (nad.get("spec") or {}).get("config")
    if not isinstance(raw, str):
        raise ConvertError(
            "NetworkAttachmentDefinition has no spec.config string; configs kept in "
            "files on the node cannot be converted from the NAD alone"
        )
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConvertError(
            f"spec.config is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    if not isinstance(config, dict):
        raise ConvertError("spec.config must hold a JSON object")
    if "name" not in config and isinstance(name, str):
        config = {"name": name, **config}  # the multi-net spec injects the NAD name
    return Source(config, name, meta.get("namespace"))


def dns_label(text: str, fallback: str = "network") -> str:
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:63].strip("-")
    return label or fallback


def to_document(
    source: Source,
    kind: OutputKind = OutputKind.TEMPLATE,
    name: str | None = None,
    if_name: str = "net1",
) -> dict[str, Any]:
    base = dns_label(name or source.name or "network")
    params: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "ifName": if_name,
        "config": source.config,
    }
    if kind is OutputKind.CNICONFIG:
        return params
    request = base
    devices = {
        "requests": [{"name": request, "exactly": {"deviceClassName": DEVICE_CLASS_NAME}}],
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
