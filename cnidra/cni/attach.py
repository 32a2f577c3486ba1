"""A pod's attachments as one unit: ADD all in a fixed order or none (rollback), DEL all in
reverse. Used by `cnidra try` and by the NRI hook; needs nothing but the runtime."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cnidra.api.netconf import to_conflist
from cnidra.api.types import CNIConfig
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
    """One interface to set up in a pod, fully resolved."""

    claim: str
    request: str
    if_name: str
    network: Mapping[str, Any]
    pool: str
    device: str
    capability_args: Mapping[str, Any] = field(default_factory=dict)
    cni_args: tuple[tuple[str, str], ...] = ()
    share_id: str | None = None
    # the user's config.name, shown in status and events; `network` carries the name plugins see
    network_label: str = ""

    @classmethod
    def from_config(
        cls,
        claim: str,
        request: str,
        config: CNIConfig,
        pool: str,
        device: str,
        extra_args: Sequence[tuple[str, str]] = (),
        share_id: str | None = None,
    ) -> Attachment:
        if config.if_name is None or config.config is None:
            raise CNIRuntimeError(f"claim {claim} request {request}: config is incomplete")
        caps = config.capabilities.runtime_values() if config.capabilities else {}
        args = (*extra_args, *sorted((config.args or {}).items()))
        return cls(
            claim,
            request,
            config.if_name,
            to_conflist(config.config),
            pool,
            device,
            caps,
            tuple(args),
            share_id,
        )

    def netconf(self) -> NetworkConfigList:
        return NetworkConfigList.from_dict(self.network)

    def runtime_conf(self, container_id: str, netns: str) -> RuntimeConf:
        args = (
            self.cni_args if IGNORE_UNKNOWN in self.cni_args else (IGNORE_UNKNOWN, *self.cni_args)
        )
        return RuntimeConf(container_id, netns, self.if_name, args, dict(self.capability_args))

    @property
    def network_name(self) -> str:
        return self.network_label or str(self.network.get("name", ""))

    @property
    def label(self) -> str:
        return f"claim {self.claim} request {self.request} ({self.if_name})"


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
                attachment.netconf(), attachment.runtime_conf(container_id, netns), budget.add
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
                outcome.attachment.netconf(),
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
                attachment.netconf(), attachment.runtime_conf(container_id, netns), deadline
            )
        except CNIRuntimeError as exc:
            errors.append(f"{attachment.label}: {_reason(exc)}")
    return errors


def _reason(exc: CNIRuntimeError) -> str:
    return str(exc.cause) if isinstance(exc, PluginFailed) else str(exc)
