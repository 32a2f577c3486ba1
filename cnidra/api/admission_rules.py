"""What the cluster refuses beyond the driver's verdict: the shipped ValidatingAdmissionPolicies'
rules on claims (deploy/admission.yaml) and on pods (Multus annotations beside cnidra claims),
judged offline for `cnidra validate`. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cnidra.api.claimspec import (
    devices_of,
    is_dns_label,
    read_spec,
)
from cnidra.api.constants import (
    API_GROUP,
    DEVICE_CLASS_NAME,
    DRIVER_NAME,
)
from cnidra.api.issues import ROOT, FieldPath, Issues, describe, listing
from cnidra.api.multus import NETWORKS_ANNOTATION

POD_TEMPLATE_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job")


def pod_spec(doc: Mapping[str, Any]) -> tuple[Any, FieldPath]:
    """A Pod's spec, or a workload's pod template spec, with its path."""
    if doc.get("kind") == "Pod":
        return doc.get("spec"), ROOT / "spec"
    template = (
        (doc.get("spec") or {}).get("template") if isinstance(doc.get("spec"), dict) else None
    )
    spec = template.get("spec") if isinstance(template, dict) else None
    return spec, ROOT / "spec" / "template" / "spec"


def namespace_of(doc: Any) -> str:
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    return str((meta.get("namespace") if isinstance(meta, dict) else None) or "default")


CLAIM_CONFIG_LABEL = f"{API_GROUP}/claim-config"
CLASSES_ANNOTATION = f"{API_GROUP}/device-classes"
MULTUS_ANNOTATIONS = (NETWORKS_ANNOTATION, "v1.multus-cni.io/default-network")


@dataclass(frozen=True)
class Admission:
    """The shipped ValidatingAdmissionPolicies' rules on claims (deploy/admission.yaml), judged
    offline with what is known of the claims' namespace: its labels and annotations (None when
    not given: then a warning says what the rule needs instead of a verdict)."""

    labels: Mapping[str, str] | None = None
    annotations: Mapping[str, str] | None = None

    def judge(self, doc: Mapping[str, Any], kind: str, issues: Issues) -> None:
        devices, dpath = devices_of({**doc, "kind": kind})
        spec = read_spec(devices, dpath, Issues()) if isinstance(devices, dict) else None
        ours = spec is not None and any(c.driver == DRIVER_NAME for c in spec.configs)
        namespace = namespace_of(doc)
        if ours:
            self._claim_config(namespace, dpath / "config", issues)
        admin = sorted(
            {
                str(r.device_class)
                for r in (spec.requests if spec is not None else ())
                if str(r.device_class).endswith("." + DEVICE_CLASS_NAME)
            }
        )
        if not admin:
            return
        rule = (
            f"the shipped admission (ValidatingAdmissionPolicy device-classes.{API_GROUP}) "
            f"admits a cnidra admin class only in a namespace whose annotation "
            f"{CLASSES_ANNOTATION} lists it (an admin sets it: kubectl annotate namespace "
            f"{namespace} {CLASSES_ANNOTATION}={','.join(admin)})"
        )
        if self.annotations is None:
            issues.warn(
                dpath / "requests",
                f"DeviceClass(es) {', '.join(admin)}: {rule}; --namespace-annotation "
                f"{CLASSES_ANNOTATION}=... checks namespace {namespace}'s",
            )
            return
        # as the CEL rule reads it: split at commas, nothing trimmed
        listed = (self.annotations.get(CLASSES_ANNOTATION) or "").split(",")
        refused = [c for c in admin if c not in listed]
        if refused:
            issues.error(
                dpath / "requests",
                f"namespace {namespace} may not use DeviceClass(es) {', '.join(refused)}: "
                f"{rule}; --namespace-annotation does not list them",
            )

    def _claim_config(self, namespace: str, path: FieldPath, issues: Issues) -> None:
        label = f"{CLAIM_CONFIG_LABEL}=true"
        how = f"an admin sets it: kubectl label namespace {namespace} {label}"
        if self.labels is None:
            issues.warn(
                path,
                f"the shipped admission refuses {DRIVER_NAME} configs in the claims of a "
                f"namespace without the label {label} ({how}); --namespace-labels KEY=VALUE,... "
                f"checks namespace {namespace}'s labels",
            )
        elif self.labels.get(CLAIM_CONFIG_LABEL) != "true":
            issues.error(
                path,
                f"namespace {namespace} may not carry {DRIVER_NAME} configs in its claims: the "
                f"shipped admission (ValidatingAdmissionPolicy claim-config.{API_GROUP}) refuses "
                f"them without the label {label}, which --namespace-labels does not give; {how}",
            )


def check_pod(doc: Mapping[str, Any], issues: Issues) -> None:
    """What a Pod (or a workload's pod template) has that the apiserver refuses or that cnidra
    does not read: a container's claim that names no pod claim, Multus' annotations."""
    _multus_annotations(doc.get("metadata"), ROOT / "metadata", issues)
    spec, base = pod_spec(doc)
    if doc.get("kind") != "Pod":
        template = (
            doc.get("spec", {}).get("template") if isinstance(doc.get("spec"), dict) else None
        )
        if isinstance(template, dict):
            _multus_annotations(
                template.get("metadata"), ROOT / "spec" / "template" / "metadata", issues
            )
    if not isinstance(spec, dict):
        return
    entries = spec.get("resourceClaims")
    names: list[str] = []
    for i, entry in enumerate(entries if isinstance(entries, list) else []):
        name = entry.get("name") if isinstance(entry, dict) else None
        if not is_dns_label(name):
            issues.error(
                base / "resourceClaims" / i / "name",
                f"{describe(name)} must be a DNS label (lowercase letters, digits and '-')",
            )
            continue
        if name in names:
            issues.error(
                base / "resourceClaims" / i / "name",
                f"{name!r} is given twice; the apiserver refuses a pod whose claims share a name",
            )
        names.append(name)
        sources = [k for k in ("resourceClaimName", "resourceClaimTemplateName") if k in entry]
        if len(sources) != 1:
            issues.error(
                base / "resourceClaims" / i,
                "must set exactly one of resourceClaimName and resourceClaimTemplateName; it "
                f"sets {' and '.join(sources) or 'neither'}",
            )
    known = listing(names) or "none"
    for group in ("initContainers", "containers"):
        containers = spec.get(group)
        for i, container in enumerate(containers if isinstance(containers, list) else []):
            resources = container.get("resources") if isinstance(container, dict) else None
            claims = resources.get("claims") if isinstance(resources, dict) else None
            for j, claim in enumerate(claims if isinstance(claims, list) else []):
                name = claim.get("name") if isinstance(claim, dict) else None
                if name not in names:
                    issues.error(
                        base / group / i / "resources" / "claims" / j / "name",
                        f"{describe(name)} names no entry of the pod's resourceClaims "
                        f"(known: {known}); the apiserver refuses the pod",
                    )


def _multus_annotations(meta: Any, path: FieldPath, issues: Issues) -> None:
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    for key in MULTUS_ANNOTATIONS:
        if isinstance(annotations, dict) and key in annotations:
            issues.warn(
                path / "annotations" / key,
                "is Multus', and cnidra ignores it: a pod's cnidra interfaces come from its "
                "resourceClaims (without Multus nothing reads it); `cnidra convert FILE` turns "
                "it into claim templates and the pod's resourceClaims",
            )
