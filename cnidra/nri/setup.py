"""What is set up on a pod's interface besides its plugins, right after its ADD and undone
after its DEL: the rate limit its claim reserved (cnidra.datapath.shaping) and the network
policy's table (through a PolicyHook). Each limit is applied in a thread, within what is left
of the ADD's budget: the event loop never waits on netlink. A limit that depends on more than
the attachment (a class's rules as last watched, a share of what its link's reservations
leave) comes from a BandwidthHook (cnidra.nri.bandwidth.BandwidthKeeper), which is told when
interfaces come and go."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from cnidra.api.bandwidth import Rate
from cnidra.cni.attach import AfterAdd, Attachment, SetupFailed
from cnidra.cni.invoke import Deadline
from cnidra.cni.result import Result
from cnidra.datapath import shaping
from cnidra.state import journal as events
from cnidra.state.journal import Journal
from cnidra.state.sandboxes import SandboxRecord

log = logging.getLogger(__name__)

# the most one rate limit's apply or removal may take (within a hook: what is left of its ADD
# budget, if less)
SHAPING_TIMEOUT = shaping.DEFAULT_TIMEOUT_SECONDS
REASON_SHAPING = "shaping"  # the ATTACH_FAILURES reason of a rate limit that failed


class Shaper(Protocol):
    """Rate limits on pod interfaces (cnidra.datapath.shaping; tests pass a fake). Both raise
    shaping.ShapingError (Gone: the namespace or interface is not there)."""

    def apply(self, netns: str, interface: str, limit: Rate, *, timeout: float) -> object: ...

    def remove(self, netns: str, interface: str, *, timeout: float) -> bool: ...


class PolicyHook(Protocol):
    """Network policy at attach and detach (cnidra.nri.netpolicy.PolicyEnforcer): the
    interface's table applied right after its ADD from what is in memory (SetupFailed fails
    the attachment), the addresses told once the sandbox is set up, tables dropped."""

    async def at_add(
        self,
        record: SandboxRecord,
        labels: Mapping[str, str] | None,
        att: Attachment,
        deadline: Deadline | None,
        result: Result | None = None,
    ) -> None: ...

    def attached(self, record: SandboxRecord) -> None: ...

    async def detached(self, record: SandboxRecord, attachments: Sequence[Attachment]) -> None: ...

    def forget(self, record: SandboxRecord) -> None: ...


class BandwidthHook(Protocol):
    """The limits that depend on more than the attachment (cnidra.nri.bandwidth.
    BandwidthKeeper): the limit an interface gets at its ADD, decided from what is in memory
    (the class's rules as last watched, the other interfaces on its link), and word that
    interfaces came or went, so the others' limits follow off the hook path."""

    def limit_of(self, att: Attachment) -> Rate | None: ...

    def changed(self) -> None: ...


class InterfaceSetup:
    """`shaper`: what holds an interface whose attachment has a `rate` to it, right after its
    ADD (a failure fails the attachment), and removes it after an unplug's DEL; `policy`:
    network policy, None when it is off; `bandwidth`: the limits that depend on more than the
    attachment (the agent's BandwidthKeeper), None: the rate prepare decided."""

    def __init__(
        self,
        shaper: Shaper,
        policy: PolicyHook | None,
        journal: Journal,
        bandwidth: BandwidthHook | None = None,
    ) -> None:
        self.shaper = shaper
        self.policy = policy
        self.journal = journal
        self.bandwidth = bandwidth

    def limited(self, att: Attachment) -> Attachment:
        """`att` with the limit it gets now (its sandbox's record is in the store already: an
        interface that shares its link's leftover counts itself)."""
        if self.bandwidth is None:
            return att
        return replace(att, rate=self.bandwidth.limit_of(att))

    def interfaces_changed(self) -> None:
        """Interfaces came or went: the others' limits follow (off the hook path)."""
        if self.bandwidth is not None:
            self.bandwidth.changed()

    def after_add(
        self,
        netns: str,
        deadline: Deadline | None,
        record: SandboxRecord | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> AfterAdd:
        """Hold each attachment that has a `rate` to it right after its ADD, within what is
        left of the ADD budget (at most SHAPING_TIMEOUT), in a thread: the event loop never
        waits on netlink. A limit that cannot be applied fails the attachment (SetupFailed),
        so it is rolled back and no interface runs without the limit its claim reserved."""

        async def shape(att: Attachment, result: Result | None = None) -> None:
            await limit(att)
            if self.policy is not None and record is not None:
                await self.policy.at_add(record, labels, att, deadline, result)

        async def limit(att: Attachment) -> None:
            if att.rate is None:
                return
            timeout = SHAPING_TIMEOUT
            if deadline is not None:
                timeout = min(timeout, deadline.remaining())
            what = f"rate limit {att.rate} on {att.if_name}"
            if timeout <= 0:
                why = deadline.describe() if deadline is not None else "no time"
                raise SetupFailed(f"{what} could not be applied: {why} ran out", REASON_SHAPING)
            try:
                await asyncio.to_thread(
                    self.shaper.apply, netns, att.if_name, att.rate, timeout=timeout
                )
            except shaping.ShapingError as exc:
                raise SetupFailed(f"{what} could not be applied: {exc}", REASON_SHAPING) from exc

        return shape

    def attached(self, record: SandboxRecord) -> None:
        """The sandbox's record is `added` with these attachments (policy learns addresses)."""
        if self.policy is not None:
            self.policy.attached(record)
        self.interfaces_changed()

    def forget(self, record: SandboxRecord) -> None:
        """The sandbox's record is gone."""
        if self.policy is not None:
            self.policy.forget(record)
        self.interfaces_changed()

    async def undo(
        self, record: SandboxRecord, netns: str, attachments: Sequence[Attachment]
    ) -> None:
        """After the DEL of some of a live sandbox's interfaces (in `netns`, "" when the DEL
        ran without one): their tables dropped, their rate limits removed."""
        if self.policy is not None:
            await self.policy.detached(record, attachments)
        await self._unlimit(record, netns, attachments)

    async def _unlimit(
        self, record: SandboxRecord, netns: str, attachments: Sequence[Attachment]
    ) -> None:
        """Remove the rate limits of interfaces DELed from a live sandbox (its IFB stays in the
        namespace otherwise); Gone is done. A failure is logged and journalled, not raised:
        the interface is gone, what is left (an idle IFB) is replaced by the next apply."""
        for att in attachments:
            if att.rate is None or not netns:
                continue
            try:
                await asyncio.to_thread(
                    self.shaper.remove, netns, att.if_name, timeout=SHAPING_TIMEOUT
                )
            except shaping.Gone:
                continue
            except shaping.ShapingError as exc:
                message = f"removing the rate limit of {att.if_name}: {exc}"
                log.warning("pod %s: %s", record.pod, message)
                self.journal.record(events.DETACH_FAILED, record.pod, record.sandbox_id, message)
