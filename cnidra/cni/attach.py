"""A pod's attachments as one unit: ADD all in a fixed order or none (rollback), DEL all in
reverse. Used by `cnidra try` and by the NRI hook; needs nothing but the runtime."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from cnidra.api.constants import DRIVER_NAME
from cnidra.api.issues import FieldPath, Issues
from cnidra.api.merge import ConfigEntry, Source, applicable
from cnidra.api.naming import Slot
from cnidra.api.netconf import to_conflist
from cnidra.api.networks import NamedNetwork, NetworkCatalog
from cnidra.api.ownership import PrivateDirs, owned_network, owned_network_name
from cnidra.api.policy import bind_to_device, governing_policy
from cnidra.api.refs import ObjectRef
from cnidra.api.validate import ResolvedRequest, check_request
from cnidra.cni.errors import CNIRuntimeError
from cnidra.cni.invoke import Deadline
from cnidra.cni.result import Result
from cnidra.cni.runtime import CNIRuntime, PluginFailed
from cnidra.cni.types import NetworkConfigList, RuntimeConf

# Plugins must ignore CNI_ARGS they do not know (K8S_POD_*, a user's args); containerd sends it
# too. Added where the runtime config is made, so no way of building an Attachment can miss it.
IGNORE_UNKNOWN = ("IgnoreUnknown", "1")


@dataclass(frozen=True)
class Attachment:
    """One interface to set up in a pod, fully resolved: what prepare checkpoints, what a
    sandbox record holds, what the runtime executes. `network` is the conflist as plugins see
    it (the name and state directories cnidra owns); `network_label` is the user's name."""

    claim: ObjectRef
    request: str
    if_name: str
    network: Mapping[str, Any]
    pool: str
    device: str
    capability_args: Mapping[str, Any] = field(default_factory=dict)
    cni_args: tuple[tuple[str, str], ...] = ()
    share_id: str | None = None
    network_label: str = ""
    # the host link the scheduler allocated and the network is bound to ("" for `try`), and
    # whether the DeviceClass's CNIPolicy lets it be a link that carries the node
    parent: str = ""
    node_link_allowed: bool = False
    # not added at sandbox start: plugged and unplugged through the node API
    on_demand: bool = False
    # how `if_name` was chosen (cnidra.api.naming): given, or from a prefix (None: implicit)
    explicit_name: bool = True
    if_name_prefix: str | None = None
    # the name a referenced network has for readers of Multus' network-status annotation
    status_name: str = ""
    # the IPAMClaim (in the claim's namespace) whose addresses a cnidra-IPAM network gets
    ipam_claim: str | None = None

    @cached_property
    def netconf(self) -> NetworkConfigList:
        """Parsed once per attachment, not on every ADD and DEL."""
        return NetworkConfigList.from_dict(self.network)

    def for_pod(self, pod: ObjectRef, sandbox_id: str) -> Attachment:
        """With the CNI_ARGS containerd sends for a pod, after the user's, so they win (libcni
        keeps the last value of a key)."""
        return replace(self, cni_args=(*self.cni_args, *pod_args(pod, sandbox_id)))

    def runtime_conf(self, container_id: str, netns: str) -> RuntimeConf:
        args = (
            self.cni_args if IGNORE_UNKNOWN in self.cni_args else (IGNORE_UNKNOWN, *self.cni_args)
        )
        return RuntimeConf(container_id, netns, self.if_name, args, dict(self.capability_args))

    @property
    def network_name(self) -> str:
        return self.network_label or str(self.network.get("name", ""))

    def slot(self) -> Slot:
        return Slot(
            self.label_without_name,
            self.if_name if self.explicit_name else None,
            self.if_name_prefix,
        )

    @property
    def label_without_name(self) -> str:
        return f"claim {self.claim} request {self.request}"

    @property
    def label(self) -> str:
        return f"claim {self.claim} request {self.request} ({self.if_name})"


def pod_args(pod: ObjectRef, sandbox_id: str) -> tuple[tuple[str, str], ...]:
    return (
        ("K8S_POD_NAMESPACE", pod.namespace),
        ("K8S_POD_NAME", pod.name),
        ("K8S_POD_INFRA_CONTAINER_ID", sandbox_id),
        ("K8S_POD_UID", pod.uid),
    )


def resolve_attachment(
    entries: Sequence[ConfigEntry],
    request: str,
    claim: ObjectRef,
    device: Device,
    dirs: PrivateDirs,
    issues: Issues,
    where: FieldPath,
    *,
    namespace_labels: Mapping[str, str] | None = None,
    catalog: NetworkCatalog | None = None,
    device_network: NamedNetwork | None = None,
) -> Attachment | None:
    """The one path from a claim's configs to what the runtime executes: checked against the
    class's CNIPolicy, merged and validated as `cnidra validate` does, bound to the allocated
    link, named and given state directories as cnidra owns them. None (with the reasons in
    `issues`) when the request cannot be attached."""
    before = len(issues.errors)
    resolved = check_request(
        entries,
        request,
        claim.namespace,
        namespace_labels,
        issues,
        where,
        class_known=True,
        catalog=catalog,
        device_network=device_network,
    )
    if resolved is None:
        if len(issues.errors) == before:
            issues.error(
                where,
                f"request {request!r} has no {DRIVER_NAME} config: add an opaque config "
                "with a CNIConfig (ifName and config) to the claim or its DeviceClass",
            )
        return None
    chosen = applicable(entries, request)
    verdict = governing_policy([e for e in chosen if e.source is Source.CLASS], "", {}, Issues())
    node_links = verdict.policy.node_links if verdict.policy else []
    attachment = attachment_from(resolved, claim, device, dirs, issues, where)
    if attachment is None:
        return None
    return replace(attachment, node_link_allowed=attachment.parent in node_links)


@dataclass(frozen=True)
class Device:
    """Where the scheduler put a request: the allocated device, and the host link it is
    (None: no link to bind to, as in `cnidra try`)."""

    pool: str
    name: str
    share_id: str | None = None
    link: str | None = None


def attachment_from(
    resolved: ResolvedRequest,
    claim: ObjectRef,
    device: Device,
    dirs: PrivateDirs,
    issues: Issues | None = None,
    where: FieldPath | None = None,
) -> Attachment | None:
    """None only when binding to the allocated link fails (the reasons in `issues`)."""
    config = resolved.config
    assert config.config is not None  # complete when resolved
    conflist = to_conflist(config.config)
    if device.link is not None:
        issues = issues if issues is not None else Issues()
        before = len(issues.errors)
        anchor = next(
            (e.path / "config" for e in reversed(resolved.entries) if "config" in e.parameters),
            where or FieldPath(),
        )
        conflist = bind_to_device(conflist, device.link, anchor, issues)
        if len(issues.errors) > before:
            return None
    label = str(conflist["name"])
    # a network the claim defines or changes is its namespace's; one wholly from the class is
    # the admin's, shared by every namespace using the class (docs/state.md)
    tenant = any(e.source is Source.CLAIM and "config" in e.parameters for e in resolved.entries)
    name = owned_network_name(label, claim.namespace if tenant else None)
    return Attachment(
        claim=claim,
        request=resolved.request,
        if_name=config.if_name or "",
        network=owned_network(conflist, name, dirs),
        pool=device.pool,
        device=device.name,
        capability_args=config.capabilities.runtime_values() if config.capabilities else {},
        cni_args=tuple(sorted((config.args or {}).items())),
        share_id=device.share_id,
        network_label=label,
        parent=device.link or "",
        on_demand=config.attach == "OnDemand",
        explicit_name=config.if_name is not None,
        if_name_prefix=config.if_name_prefix,
        status_name=resolved.network.status_name if resolved.network else "",
        ipam_claim=config.ipam_claim_reference,
    )


@dataclass
class Outcome:
    attachment: Attachment
    result: Result | None = None
    error: str | None = None

    @property
    def ready(self) -> bool:
        return self.result is not None and self.error is None


@dataclass(frozen=True)
class Budget:
    """Deadlines for a pod's attachments: ADDs must be done by `add`, and a rollback's DELs by
    `rollback` (when the caller must answer, e.g. before the runtime's hook timeout). A DEL
    that does not fit is reported as a cleanup error, for the caller to retry later."""

    add: Deadline | None = None
    rollback: Deadline | None = None


class AttachFailed(CNIRuntimeError):
    def __init__(self, outcomes: list[Outcome], failed: Outcome, cleanup_errors: list[str]) -> None:
        message = f"{failed.attachment.label}: {failed.error}"
        if cleanup_errors:
            message += "; cleanup also failed: " + "; ".join(cleanup_errors)
        super().__init__(message)
        self.outcomes = outcomes
        self.failed = failed
        self.cleanup_errors = cleanup_errors


async def attach_all(
    runtime: CNIRuntime,
    attachments: Sequence[Attachment],
    container_id: str,
    netns: str,
    *,
    concurrent: bool = False,
    budget: Budget = Budget(),
) -> list[Outcome]:
    """ADD each attachment in order. On the first failure (a plugin error, or the budget
    running out) DEL every attachment already added, the failing one included, then raise
    AttachFailed carrying every outcome. A cancelled caller owns the rollback: it knows
    what it recorded (the NRI hook DELs from its write-ahead record).

    `concurrent` ADDs them all at once instead (docs/cni-runtime.md says when that pays); if
    any fails, all are DELed."""
    if concurrent and len(attachments) > 1:
        return await _attach_concurrently(runtime, attachments, container_id, netns, budget)
    outcomes: list[Outcome] = []
    for attachment in attachments:
        outcome = Outcome(attachment)
        outcomes.append(outcome)
        try:
            outcome.result = await runtime.add(
                attachment.netconf, attachment.runtime_conf(container_id, netns), budget.add
            )
        except CNIRuntimeError as exc:
            outcome.error = _reason(exc)
            cleanup = await detach_all(
                runtime, [o.attachment for o in outcomes], container_id, netns, budget.rollback
            )
            for earlier in outcomes[:-1]:
                earlier.result = None
                earlier.error = f"rolled back because {attachment.label} failed"
            raise AttachFailed(outcomes, outcome, cleanup) from exc
    return outcomes


async def _attach_concurrently(
    runtime: CNIRuntime,
    attachments: Sequence[Attachment],
    container_id: str,
    netns: str,
    budget: Budget,
) -> list[Outcome]:
    outcomes = [Outcome(a) for a in attachments]

    async def one(outcome: Outcome) -> None:
        try:
            outcome.result = await runtime.add(
                outcome.attachment.netconf,
                outcome.attachment.runtime_conf(container_id, netns),
                budget.add,
            )
        except CNIRuntimeError as exc:
            outcome.error = _reason(exc)

    await asyncio.gather(*(one(o) for o in outcomes))
    failed = next((o for o in outcomes if o.error), None)
    if failed is None:
        return outcomes
    cleanup = await detach_all(runtime, attachments, container_id, netns, budget.rollback)
    for outcome in outcomes:
        if outcome is not failed:
            outcome.result = None
            outcome.error = outcome.error or f"rolled back because {failed.attachment.label} failed"
    raise AttachFailed(outcomes, failed, cleanup)


async def detach_all(
    runtime: CNIRuntime,
    attachments: Sequence[Attachment],
    container_id: str,
    netns: str,
    deadline: Deadline | None = None,
) -> list[str]:
    """DEL every attachment in reverse order; try them all, return the errors."""
    errors: list[str] = []
    for attachment in reversed(attachments):
        try:
            await runtime.delete(
                attachment.netconf, attachment.runtime_conf(container_id, netns), deadline
            )
        except CNIRuntimeError as exc:
            errors.append(f"{attachment.label}: {_reason(exc)}")
    return errors


def _reason(exc: CNIRuntimeError) -> str:
    return str(exc.cause) if isinstance(exc, PluginFailed) else str(exc)
