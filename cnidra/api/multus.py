"""Multus' pod annotation `k8s.v1.cni.cncf.io/networks`, read as Multus reads it (the
network-selection element of the multi-net spec): a comma-separated list of
`[namespace/]name[@interface]`, or a JSON list of objects with `name`, `namespace`,
`interface`, `ips`, `mac`, `default-route` (and others cnidra names but cannot carry). Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cnidra.api.loading import LoadError, load_json

NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
WORKLOAD_KINDS = ("Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# what a selection element may carry; cnidra honours name, namespace and interface, and names
# the rest where it cannot carry them
KNOWN = {
    "name", "namespace", "interface", "ips", "mac", "default-route", "cni-args",
    "infiniband-guid", "portMappings", "bandwidth", "ipam-claim-reference",
}  # fmt: skip


class AnnotationError(ValueError):
    """The annotation cannot be read; the message names the element and what is allowed."""


@dataclass(frozen=True)
class Selection:
    name: str
    namespace: str
    interface: str | None = None
    # what the element asked that a claim cannot carry as it is: field -> value
    extras: Mapping[str, Any] = field(default_factory=dict)

    @property
    def reference(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_networks(text: str, namespace: str) -> list[Selection]:
    """The networks a pod asks for, in order; `namespace` is the pod's (the default)."""
    text = text.strip()
    if not text:
        return []
    if text.startswith("["):
        try:
            items = load_json(text, NETWORKS_ANNOTATION)
        except LoadError as exc:
            raise AnnotationError(str(exc)) from None
        if not isinstance(items, list):
            raise AnnotationError(f"{NETWORKS_ANNOTATION}: must be a JSON list of objects")
        return [_element(item, i, namespace) for i, item in enumerate(items)]
    out = []
    for i, part in enumerate(p.strip() for p in text.split(",")):
        if not part:
            continue
        ref, _, interface = part.partition("@")
        ns, _, name = ref.rpartition("/")
        out.append(_selection(name, ns or namespace, interface or None, {}, f"[{i}] {part!r}"))
    return out


def _element(item: Any, index: int, namespace: str) -> Selection:
    where = f"[{index}]"
    if not isinstance(item, dict):
        raise AnnotationError(f"{NETWORKS_ANNOTATION}{where}: must be an object, not {item!r}")
    unknown = sorted(set(item) - KNOWN)
    if unknown:
        raise AnnotationError(
            f"{NETWORKS_ANNOTATION}{where}: unknown field(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(KNOWN))}"
        )
    name, ns, interface = item.get("name"), item.get("namespace"), item.get("interface")
    for key, value in (("name", name), ("namespace", ns), ("interface", interface)):
        if value is not None and not isinstance(value, str):
            raise AnnotationError(f"{NETWORKS_ANNOTATION}{where}.{key}: must be a string")
    extras = {k: v for k, v in item.items() if k not in ("name", "namespace", "interface")}
    return _selection(str(name or ""), ns or namespace, interface, extras, where)


def _selection(
    name: str, namespace: str, interface: str | None, extras: Mapping[str, Any], where: str
) -> Selection:
    if not _NAME.match(name):
        raise AnnotationError(
            f"{NETWORKS_ANNOTATION}{where}: {name!r} is not a NetworkAttachmentDefinition name"
        )
    if not _NAME.match(namespace) or "." in namespace:
        raise AnnotationError(f"{NETWORKS_ANNOTATION}{where}: {namespace!r} is not a namespace")
    return Selection(name, namespace, interface, dict(extras))


def pod_template(workload: Mapping[str, Any]) -> dict[str, Any] | None:
    """The pod (metadata and spec) a workload makes: a Pod itself, a controller's
    spec.template, a CronJob's spec.jobTemplate.spec.template."""
    kind = workload.get("kind")
    spec = workload.get("spec")
    if kind == "Pod":
        return dict(workload)
    if not isinstance(spec, dict):
        return None
    if kind == "CronJob":
        job = spec.get("jobTemplate")
        spec = job.get("spec") if isinstance(job, dict) else None
        if not isinstance(spec, dict):
            return None
    template = spec.get("template")
    return template if isinstance(template, dict) else None
