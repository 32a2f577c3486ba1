"""An attached sandbox changed one part at a time, its other attachments left running: an
on-demand network (a CNIConfig with `attach: OnDemand`) plugged or unplugged through the node
API, one claim's attachments DELed at its NodeUnprepareResources, and what a crash left
half-done of either finished at the next Synchronize. Each change is written ahead in the
sandbox record as a `pending` attachment, under the sandbox's lock the state machine holds
for its own transitions (`PodLifecycle`, which this room is part of)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from cnidra.cni.attach import AttachFailed, Attachment, attach_all, detach_all
from cnidra.cni.runtime import CNIRuntime
from cnidra.nri.budget import HookBudget
from cnidra.nri.reporting import Reporting, count_failure, observe_del
from cnidra.nri.setup import InterfaceSetup
from cnidra.state import journal as events
from cnidra.state.checkpoint import Checkpoint
from cnidra.state.journal import Journal
from cnidra.state.sandboxes import Attached, SandboxRecord, SandboxStore, State
from cnidra.util.locks import KeyedLocks

log = logging.getLogger(__name__)


class PlugError(Exception):
    """A node API plug or unplug that cannot be done, with why."""


class Host(Protocol):
    """What hot-plug uses of the pod lifecycle: its stores and locks, and what it was built
    with (read at each call: tests and the agent may replace them)."""

    @property
    def checkpoint(self) -> Checkpoint: ...
    @property
    def store(self) -> SandboxStore: ...
    @property
    def locks(self) -> KeyedLocks: ...
    @property
    def runtime(self) -> CNIRuntime: ...
    @property
    def budget(self) -> HookBudget: ...
    @property
    def journal(self) -> Journal: ...
    @property
    def setup(self) -> InterfaceSetup: ...
    @property
    def reporting(self) -> Reporting: ...
    @property
    def protected_links(self) -> Callable[[], frozenset[str]]: ...

    def netns_for_del(self, record: SandboxRecord) -> str: ...

    def in_node_netns(self, path: str) -> bool: ...


class HotPlug:
    def __init__(self, host: Host) -> None:
        self.host = host

    def on_demand(self, record: SandboxRecord, claim: str, request: str) -> Attachment:
        """The pod's on-demand attachment of `claim` (its name, or the pod's name for it) and
        `request`, from the checkpoint; PlugError when there is none."""
        for prepared in self.host.checkpoint.for_pod(record.pod.uid):
            if claim not in (prepared.ref.name, prepared.pod_claim_name):
                continue
            for device in prepared.devices:
                if device.request == request and device.on_demand:
                    return device.for_pod(record.pod, record.sandbox_id)
        raise PlugError(
            f"pod {record.pod} has no on-demand attachment for claim {claim!r} request "
            f"{request!r} (a CNIConfig with attach: OnDemand, prepared for this pod)"
        )

    def _live_record(self, sandbox_id: str) -> SandboxRecord:
        record = self.host.store.get(sandbox_id)
        if record is None or record.state is not State.ADDED:
            raise PlugError(f"sandbox {sandbox_id[:12]} has no attached record to plug into")
        if self.host.in_node_netns(record.netns):
            raise PlugError(f"sandbox {sandbox_id[:12]}'s network namespace is gone")
        return record

    async def plug(self, sandbox_id: str, claim: str, request: str) -> Attached:
        """ADD an on-demand attachment to a running sandbox: the same checkpointed config,
        write-ahead record, rollback, status, finalizer and metadata as at sandbox start."""
        host = self.host
        async with host.locks.hold(sandbox_id):
            record = self._live_record(sandbox_id)
            att = self.on_demand(record, claim, request)
            if any(a.attachment.if_name == att.if_name for a in record.attachments):
                raise PlugError(f"pod {record.pod} already has {att.if_name}")
            if att.parent in host.protected_links() and not att.node_link_allowed:
                raise PlugError(f"link {att.parent!r} now carries the node itself; refused")
            pending = Attached(att, None, pending=True)
            await host.store.put(replace(record, attachments=(*record.attachments, pending)))
            started = time.perf_counter()
            budget = host.budget.deadlines()
            try:
                [outcome] = await attach_all(
                    host.runtime,
                    [att],
                    sandbox_id,
                    record.netns,
                    budget=budget,
                    after_add=host.setup.after_add(record.netns, budget.add, record),
                )
            except AttachFailed as failed:
                count_failure(att, failed.failed.reason or "runtime")
                if not failed.cleanup_errors:
                    await host.store.put(record)
                host.reporting.outcomes(failed.outcomes)
                host.journal.record(events.ATTACH_FAILED, record.pod, sandbox_id, str(failed))
                raise PlugError(f"pod {record.pod}: {failed}") from None
            done = Attached(att, outcome.result.to_json() if outcome.result else None)
            plugged = replace(record, attachments=(*record.attachments, done))
            await host.store.put(plugged)
            host.setup.attached(plugged)
            host.reporting.outcomes([outcome], record.pod)
            host.reporting.annotate(record.pod, (*record.attachments, done))
            host.reporting.attached_claims([att.claim])
            host.journal.record(
                events.ATTACHED,
                record.pod,
                sandbox_id,
                f"plugged {att.if_name} ({att.network_label})",
                (time.perf_counter() - started) * 1000,
            )
            return done

    async def unplug(self, sandbox_id: str, claim: str, request: str) -> None:
        """DEL an on-demand attachment from a running sandbox; the others stay."""
        host = self.host
        async with host.locks.hold(sandbox_id):
            record = self._live_record(sandbox_id)
            att = self.on_demand(record, claim, request)
            rest = tuple(a for a in record.attachments if a.attachment.if_name != att.if_name)
            if len(rest) == len(record.attachments):
                raise PlugError(f"pod {record.pod} has no {att.if_name} plugged")
            going = [a for a in record.attachments if a.attachment.if_name == att.if_name]
            errors = await self.detach_part(sandbox_id, record, going)
            if errors:
                host.journal.record(events.DETACH_FAILED, record.pod, sandbox_id, "; ".join(errors))
                raise PlugError(f"pod {record.pod}: " + "; ".join(errors))
            host.journal.record(events.DETACHED, record.pod, sandbox_id, f"unplugged {att.if_name}")
            host.reporting.removed(record.pod, [att])

    async def detach_part(
        self, sandbox_id: str, record: SandboxRecord, going: list[Attached]
    ) -> list[str]:
        """DEL some of a live sandbox's attachments (one claim's, or one unplugged network),
        the others kept, under the sandbox's lock the caller holds: marked pending on disk
        first (a crash is finished by the next Synchronize), then DELed; once all went, their
        rate limits removed, the record kept with the rest, the annotation and statuses
        updated and each claim no sandbox holds any more released. The DELs' errors (the
        record keeps them pending)."""
        host = self.host
        marked = tuple(replace(a, pending=True) if a in going else a for a in record.attachments)
        await host.store.put(replace(record, attachments=marked))
        errors = await detach_all(
            host.runtime,
            [a.attachment for a in going],
            sandbox_id,
            host.netns_for_del(record),
            on_done=observe_del,
        )
        if errors:
            return errors
        await host.setup.undo(record, host.netns_for_del(record), [a.attachment for a in going])
        rest = replace(record, attachments=tuple(a for a in record.attachments if a not in going))
        await host.store.put(rest)
        host.reporting.unplugged(rest, going)
        return []

    async def finish_unplugs(self, record: SandboxRecord) -> None:
        """A crash while plugging or unplugging left `pending` attachments in an attached
        record: DEL them and keep the rest (called by Synchronize)."""
        host = self.host
        async with host.locks.hold(record.sandbox_id):
            pending = [a for a in record.attachments if a.pending]
            if not pending:
                return
            errors = await detach_all(
                host.runtime,
                [a.attachment for a in pending],
                record.sandbox_id,
                host.netns_for_del(record),
                on_done=observe_del,
            )
            if errors:
                log.warning("undoing a half-done plug of %s: %s", record.pod, "; ".join(errors))
                return
            await host.setup.undo(
                record, host.netns_for_del(record), [a.attachment for a in pending]
            )
            rest = tuple(a for a in record.attachments if not a.pending)
            await host.store.put(replace(record, attachments=rest))
