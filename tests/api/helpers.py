from __future__ import annotations

from typing import Any

from cnidra.api.issues import FieldPath, Issues
from cnidra.api.validate import parse_parameters, validate_documents


def params(config: Any, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
        "kind": "CNIConfig",
        "ifName": "net1",
        "config": config,
        **extra,
    }


def conflist(*plugins: dict[str, Any], version: str = "1.0.0") -> dict[str, Any]:
    return {"cniVersion": version, "name": "test-net", "plugins": list(plugins)}


def claim(*configs: dict[str, Any], requests: tuple[str, ...] = ("net",)) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": r, "exactly": {"deviceClassName": "cni.networking.x-k8s.io"}}
                    for r in requests
                ],
                "config": [
                    {
                        "requests": list(reqs),
                        "opaque": {"driver": "cni.dra.networking.x-k8s.io", "parameters": p},
                    }
                    for p, reqs in (c.popitem() for c in map(dict, configs))
                ],
            }
        },
    }


def errors_of(p: Any) -> dict[str, str]:
    issues = Issues()
    parse_parameters(p, FieldPath(), issues, complete=True)
    return {str(i.path): i.message for i in issues.errors}


def doc_errors(*docs: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for report in validate_documents(list(docs)):
        out.update({str(i.path): i.message for i in report.issues.errors})
    return out


def device_class(name: str, *parameters: dict[str, Any]) -> dict[str, Any]:
    """A DeviceClass carrying opaque configs of cnidra's (a CNIPolicy, a CNIConfig...)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {
            "config": [
                {"opaque": {"driver": "cni.dra.networking.x-k8s.io", "parameters": p}}
                for p in parameters
            ]
        },
    }


def cni_policy(**claims: Any) -> dict[str, Any]:
    return {"apiVersion": "cni.networking.x-k8s.io/v1alpha1", "kind": "CNIPolicy", "claims": claims}
