"""A pod's attachments as one unit: ADD all in a fixed order or none (rollback), DEL all in
reverse. Used by `cnidra try` and by the NRI hook; needs nothing but the runtime. What an
Attachment holds is decided before, by prepare (`cnidra.dra.resolve`)."""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from cnidra.api.bandwidth import Rate, Terms
from cnidra.api.naming import Slot
from cnidra.api.refs import ObjectRef
from cnidra.cni.errors import (
    CNIRuntimeError,
    PluginError,
    PluginNotFound,
    PluginOutputError,
    PluginTimeout,
)
from cnidra.cni.invoke import Deadline
from cnidra.cni.result import Result
from cnidra.cni.runtime import CNIRuntime, PluginFailed
from cnidra.cni.types import NetworkConfigList, RuntimeConf

# Plugins must ignore CNI_ARGS they do not know (K8S_POD_*, a user's args); containerd sends it
# too. Added where the runtime config is made, so no way of building an Attachment can miss it.
IGNORE_UNKNOWN = ("IgnoreUnknown", "1")


@dataclass(frozen=True, slots=True)
class Attachment:
    """One interface to set up in a pod, fully resolved: what prepare checkpoints, what a
    sandbox record holds, what the runtime executes. `network` is the conflist as plugins see
    it (the name and state directories cnidra owns); `network_label` is the user's name.
    Slotted: the driver holds one per prepared request and recorded sandbox (a third of the
    size with a __dict__)."""

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
    # the rate limit cnidra holds the interface to in both directions (cnidra.api.bandwidth:
    # the claim's reserved bandwidth, or the class's CNIPolicy default); None: none
    rate: Rate | None = None
    # what `rate` is decided from (the grant, the link's speed, the class's rules and name),
    # so the node decides it again while the pod runs (cnidra.nri.bandwidth); None: a record
    # from before them, whose rate stays as prepared
    bandwidth: Terms | None = None
    # the network as a MultiNetworkPolicy's `policy-for` names it (cnidra.api.netpolicy
    # Target.key: `ns/nad`, `cninetwork:x`, `deviceclass:x`, `claim:ns/config`); "" unknown
    # (a record of a driver before it: no policy selects the interface by its network)
    policy_network: str = ""
    # prepare only (not checkpointed): the network's cnidra-IPAM pool was chosen by a tenant
    # (its claim or NetworkAttachmentDefinition), so the pool must name the namespace and lie
    # in `pool_ranges`, the DeviceClass's claims.ipRanges (None: any)
    tenant_pool: bool = False
    pool_ranges: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] | None = None
    # prepare only (not checkpointed): the network's static IPAM addresses were written by a
    # tenant, so prepare leases each through the cluster IPAM pool that owns it (docs/ipam.md)
    tenant_static: bool = False
    _netconf: NetworkConfigList | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def netconf(self) -> NetworkConfigList:
        """Parsed once per attachment, not on every ADD and DEL."""
        if self._netconf is None:
            object.__setattr__(self, "_netconf", NetworkConfigList.from_dict(self.network))
        assert self._netconf is not None
        return self._netconf

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


_INIT_FIELDS = tuple(f.name for f in fields(Attachment) if f.init)
_KNOWN = frozenset(_INIT_FIELDS)
_set = object.__setattr__


def changed(attachment: Attachment, **changes: Any) -> Attachment:
    """`dataclasses.replace(attachment, **changes)`, a third of its cost (prepare makes several
    copies of each attachment): every field copied or changed, the parsed netconf, a field
    `__init__` does not take, left to be parsed again, a name that is no field a TypeError.
    Attachment has no __post_init__, so `__init__` does nothing else (tests/cni check both)."""
    unknown = changes.keys() - _KNOWN
    if unknown:
        raise TypeError(f"Attachment has no field(s) {', '.join(sorted(unknown))} to change")
    new = object.__new__(Attachment)
    for name in _INIT_FIELDS:
        _set(new, name, changes[name] if name in changes else getattr(attachment, name))
    _set(new, "_netconf", None)
    return new


def pod_args(pod: ObjectRef, sandbox_id: str) -> tuple[tuple[str, str], ...]:
    return (
        ("K8S_POD_NAMESPACE", pod.namespace),
        ("K8S_POD_NAME", pod.name),
        ("K8S_POD_INFRA_CONTAINER_ID", sandbox_id),
        ("K8S_POD_UID", pod.uid),
    )


@dataclass
class Outcome:
    attachment: Attachment
    result: Result | None = None
    error: str | None = None
    # what the ADD took, and why it failed in a word (reason_of): for metrics
    seconds: float = 0.0
    reason: str = ""

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


class SetupFailed(CNIRuntimeError):
    """A step the caller runs on an interface once its ADD succeeded (`attach_all`'s
    `after_add`: the rate limit its claim reserved) failed: the attachment counts as failed,
    and is rolled back as a failed ADD is. `reason` is the metric label (one word)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


# what the caller runs on an attachment right after its ADD succeeded; SetupFailed fails it
AfterAdd = Callable[[Attachment, Result | None], Awaitable[None]]


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
    after_add: AfterAdd | None = None,
) -> list[Outcome]:
    """ADD each attachment in order, each followed by `after_add` (its SetupFailed is a failed
    ADD). On the first failure (a plugin error, the budget running out, a failed `after_add`)
    DEL every attachment already added, the failing one included, then raise AttachFailed
    carrying every outcome. A cancelled caller owns the rollback: it knows
    what it recorded (the NRI hook DELs from its write-ahead record).

    `concurrent` ADDs them all at once instead (docs/cni-runtime.md says when that pays); if
    any fails, all are DELed."""
    if concurrent and len(attachments) > 1:
        return await _attach_concurrently(
            runtime, attachments, container_id, netns, budget, after_add
        )
    outcomes: list[Outcome] = []
    for attachment in attachments:
        outcome = Outcome(attachment)
        outcomes.append(outcome)
        started = time.perf_counter()
        try:
            outcome.result = await runtime.add(
                attachment.netconf, attachment.runtime_conf(container_id, netns), budget.add
            )
            if after_add is not None:
                await after_add(attachment, outcome.result)
        except CNIRuntimeError as exc:
            outcome.result = None
            outcome.seconds = time.perf_counter() - started
            outcome.error = _reason(exc)
            outcome.reason = reason_of(exc)
            cleanup = await detach_all(
                runtime, [o.attachment for o in outcomes], container_id, netns, budget.rollback
            )
            for earlier in outcomes[:-1]:
                earlier.result = None
                earlier.error = f"rolled back because {attachment.label} failed"
            raise AttachFailed(outcomes, outcome, cleanup) from exc
        outcome.seconds = time.perf_counter() - started
    return outcomes


async def _attach_concurrently(
    runtime: CNIRuntime,
    attachments: Sequence[Attachment],
    container_id: str,
    netns: str,
    budget: Budget,
    after_add: AfterAdd | None = None,
) -> list[Outcome]:
    outcomes = [Outcome(a) for a in attachments]

    async def one(outcome: Outcome) -> None:
        started = time.perf_counter()
        try:
            outcome.result = await runtime.add(
                outcome.attachment.netconf,
                outcome.attachment.runtime_conf(container_id, netns),
                budget.add,
            )
            if after_add is not None:
                await after_add(outcome.attachment, outcome.result)
        except CNIRuntimeError as exc:
            outcome.result = None
            outcome.error = _reason(exc)
            outcome.reason = reason_of(exc)
        finally:
            outcome.seconds = time.perf_counter() - started

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
    on_done: Callable[[Attachment, float, str], None] | None = None,
) -> list[str]:
    """DEL every attachment in reverse order; try them all, return the errors. `on_done` is
    told each DEL's attachment, seconds and failure reason ("" when it worked)."""
    errors: list[str] = []
    for attachment in reversed(attachments):
        started = time.perf_counter()
        reason = ""
        try:
            await runtime.delete(
                attachment.netconf, attachment.runtime_conf(container_id, netns), deadline
            )
        except CNIRuntimeError as exc:
            errors.append(f"{attachment.label}: {_reason(exc)}")
            reason = reason_of(exc)
        if on_done is not None:
            on_done(attachment, time.perf_counter() - started, reason)
    return errors


def _reason(exc: CNIRuntimeError) -> str:
    return str(exc.cause) if isinstance(exc, PluginFailed) else str(exc)


def reason_of(exc: CNIRuntimeError) -> str:
    """A failure in one word of a small fixed set (a metric label, never tenant text):
    timeout, not-found, protocol, or the CNI error code's name (plugin for codes of the
    plugin's own, 100 and up)."""
    cause = exc.cause if isinstance(exc, PluginFailed) else exc
    if isinstance(cause, SetupFailed):
        return cause.reason
    if isinstance(cause, PluginTimeout):
        return "timeout"
    if isinstance(cause, PluginNotFound):
        return "not-found"
    if isinstance(cause, PluginOutputError):
        return "protocol"
    if isinstance(cause, PluginError):
        return _CODE_REASONS.get(cause.error_code, "plugin")
    return "runtime"


_CODE_REASONS = {
    1: "incompatible-version",
    2: "unsupported-field",
    3: "unknown-container",
    4: "invalid-environment",
    5: "io-failure",
    6: "decoding-failure",
    7: "invalid-config",
    11: "try-again-later",
}
