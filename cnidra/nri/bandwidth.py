"""The rate limits of running pods' interfaces kept to what they should be now, off the hook
path: `BandwidthKeeper`.

Prepare decides a limit from the allocation (cnidra.api.bandwidth.Terms: the grant, the link's
speed, the class's rules) and the hook applies it; afterwards two things can change it:

- **The class's rules.** A claim's grant cannot change while its pod runs: Kubernetes refuses
  any change to a claim's `status.allocation` once set (`validateResourceClaimStatusUpdate` in
  kubernetes/kubernetes pkg/apis/resource/validation/validation.go: "Updates to a populated
  status.Allocation are not allowed"), and its spec is immutable too, so a claim's
  `consumedCapacity` and the class config copied into its allocation stay as allocated. The
  admin's DeviceClass can change: the keeper follows its CNIPolicy's `bandwidth`
  (`whenUnreserved`, `burst`, `burstCeiling`) from a watch of DeviceClasses
  (cnidra.kube.deviceclasses) and applies the new limit to every interface of the class.
  A class deleted, or not seen yet, falls back to the rules its allocation copied; a class
  whose CNIPolicy is invalid leaves its interfaces as they are.
- **The reservations on a link**, for a claim that reserved nothing under `whenUnreserved:
  Leftover`: such interfaces share evenly what the reservations of the interfaces on their
  link (the allocated parent, on this node) leave of its speed, so unreserved pods never
  crowd reserved ones. A grant counts from its claim's prepare on (the checkpoint), before its
  pod's interface exists. The hook applies the share of the moment (from the sandbox records
  and the checkpoint, in memory) and tells the keeper, which then gives every other interface
  on the link its new share; a sandbox's interfaces going (detach), a claim prepared and one
  unprepared tell it too.

The keeper runs when told (`changed`, `replace_classes`, `class_changed`) and every `period`
seconds besides, once the DeviceClasses were listed (or a minute passed without); each pass
compares each attached interface's limit with what it should be and changes only those that
differ, each under its sandbox's lock (the hook's), in a thread, bounded by a timeout
(cnidra.datapath.shaping). A changed limit is written to the sandbox record (so a restarted
driver and `cnidra node describe` see it) and to the claim's `BandwidthLimited` condition. A
limit that cannot be applied is logged and tried again at the next pass; the interface keeps
the limit it had."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from cnidra.api.bandwidth import BandwidthRules, Rate, Terms, leftover_share
from cnidra.api.issues import Issues
from cnidra.api.policy import class_bandwidth
from cnidra.cni.attach import Attachment, Outcome
from cnidra.cni.result import Result
from cnidra.datapath import shaping
from cnidra.nri.setup import SHAPING_TIMEOUT, Shaper
from cnidra.state.checkpoint import Checkpoint
from cnidra.state.sandboxes import Attached, SandboxRecord, SandboxStore, State
from cnidra.status.devices import device_status_of
from cnidra.status.writer import StatusSink
from cnidra.util.aio import wait_set
from cnidra.util.backoff import Backoff
from cnidra.util.locks import KeyedLocks

log = logging.getLogger(__name__)

DEFAULT_PERIOD = 30.0
# link -> (bit/s its interfaces reserved, how many of them take from what is left)
Tally = Mapping[str, tuple[int, int]]
# a pass waits for the first LIST of DeviceClasses this long after the keeper starts: before
# it, a restarted driver would take its interfaces back to the rules their allocations copied,
# then forward again; past it (the classes cannot be listed), the allocations' copies hold
SYNC_GRACE_SECONDS = 60.0


class BandwidthKeeper:
    def __init__(
        self,
        store: SandboxStore,
        status: StatusSink,
        locks: KeyedLocks,
        *,
        shaper: Shaper = shaping,
        period: float = DEFAULT_PERIOD,
        timeout: float = SHAPING_TIMEOUT,
        sync_grace: float = SYNC_GRACE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        checkpoint: Checkpoint | None = None,
    ) -> None:
        """`locks`: the sandboxes' locks the hook holds (PodLifecycle.locks), so the keeper
        never changes an interface while the hook sets it up or takes it down. `checkpoint`:
        the prepared claims, whose grants count from prepare on (not only from their pod's
        sandbox)."""
        self.store = store
        self.checkpoint = checkpoint
        self.status = status
        self.locks = locks
        self.shaper = shaper
        self.period = period
        self.timeout = timeout
        # DeviceClass name -> its CNIPolicy's bandwidth rules, as the watch last said
        self.classes: dict[str, BandwidthRules] = {}
        self.applied = 0  # limits changed on running interfaces, for tests and the journal
        self.synced = False  # the DeviceClasses listed once
        self.clock = clock
        self._waits_until = clock() + sync_grace
        self._wake = asyncio.Event()

    # ------------------------------------------------------------------ what the limit is

    def rules_of(self, terms: Terms) -> BandwidthRules:
        """The class's rules as the watch says, else as the allocation copied them."""
        return self.classes.get(terms.device_class, terms.rules)

    def limit_of(self, att: Attachment, tally: Tally | None = None) -> Rate | None:
        """What the interface of `att` should be held to now (the sandbox records say who
        else is on its link; `tally`: what `tally` said of them, for a pass). An attachment
        without terms (a record from before them) keeps its rate."""
        terms = att.bandwidth
        if terms is None:
            return att.rate
        rules = self.rules_of(terms)
        share = None
        if terms.takes(rules) and att.parent:
            reserved, takers = (tally if tally is not None else self.tally()).get(
                att.parent, (0, 0)
            )
            share = leftover_share(terms.link, reserved, takers)
        return terms.decide(rules, share)

    def tally(self) -> Tally:
        """For each link, the grants of the interfaces on it and how many take from what they
        leave (those that reserved nothing under Leftover, and those that reserved and may
        burst). Every recorded interface counts, being set up, plugged or taken down
        included, and every prepared claim's grant whose interface is not there yet (its pod
        is about to start, or its on-demand network not plugged): reserved is reserved."""
        found: dict[str, tuple[int, int]] = {}
        attached: set[tuple[str, str]] = set()

        def count(att: Attachment, running: bool = True) -> None:
            if not att.parent or att.bandwidth is None:
                return
            reserved, takers = found.get(att.parent, (0, 0))
            if att.bandwidth.granted is not None:
                reserved += att.bandwidth.granted
            if running:  # one that is not there yet takes nothing
                takers += att.bandwidth.takes(self.rules_of(att.bandwidth))
            found[att.parent] = (reserved, takers)

        for record in self.store.all():
            for one in record.attachments:
                attached.add((one.attachment.claim.uid, one.attachment.request))
                count(one.attachment)
        for prepared in self.checkpoint.all() if self.checkpoint is not None else ():
            for device in prepared.devices:
                terms = device.bandwidth
                if terms is None or terms.granted is None:
                    continue  # a claim that reserved nothing needs no share before it runs
                if (prepared.ref.uid, device.request) not in attached:
                    count(device, running=False)
        return found

    # ------------------------------------------------------------------ what tells it

    def changed(self) -> None:
        """Interfaces came or went: a pass soon."""
        self._wake.set()

    def replace_classes(self, objects: Sequence[Mapping[str, Any]]) -> None:
        """A fresh LIST of DeviceClasses."""
        seen: dict[str, BandwidthRules] = {}
        for obj in objects:
            name = str((obj.get("metadata") or {}).get("name") or "")
            rules = self._rules(name, obj)
            if rules is not None:
                seen[name] = rules
            elif name in self.classes:
                seen[name] = self.classes[name]  # invalid now: as before
        if seen != self.classes or not self.synced:
            self.classes = seen
            self.synced = True
            self._wake.set()

    def class_changed(self, event: str, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        if not name:
            return
        if event == "DELETED":
            if self.classes.pop(name, None) is not None:
                self._wake.set()
            return
        rules = self._rules(name, obj)
        if rules is not None and self.classes.get(name) != rules:
            self.classes[name] = rules
            self._wake.set()

    @staticmethod
    def _rules(name: str, obj: Mapping[str, Any]) -> BandwidthRules | None:
        issues = Issues()
        rules = class_bandwidth(obj, issues)
        if rules is None:
            log.warning(
                "DeviceClass %s: its CNIPolicy is invalid (%s); its interfaces keep their "
                "rate limits",
                name,
                "; ".join(str(i) for i in issues.errors) or "no reason given",
            )
        return rules

    # ------------------------------------------------------------------ the passes

    async def run(self) -> None:
        """A pass when told, and every `period` seconds; a failed pass again after a backoff."""
        failed = Backoff(initial=min(1.0, self.period), maximum=self.period)
        wait = self.period
        while True:
            await wait_set(self._wake, wait)
            self._wake.clear()
            try:
                await self.reconcile()
                failed.reset()
                wait = self.period
            except asyncio.CancelledError:
                raise
            except Exception:
                wait = failed.next()  # the one pace, up to `period`
                log.exception("a pass over the rate limits failed; next in %.1f s", wait)

    async def reconcile(self) -> int:
        """Every attached interface held to what it should be now; how many changed. Nothing
        until the DeviceClasses were listed once, or SYNC_GRACE_SECONDS passed."""
        if not self.synced and self.clock() < self._waits_until:
            return 0
        changed = 0
        tally = self.tally()  # a record added meanwhile tells the keeper: the next pass
        for sandbox_id in [r.sandbox_id for r in self.store.all()]:
            # only a sandbox with an interface to change is locked and done again (what is
            # read here without its lock; a record changed later tells the keeper: the next
            # pass): the others, most of them on most passes, cost no lock and no wait behind
            # the ADD or DEL that holds it
            record = self.store.get(sandbox_id)
            if record is not None and self._due(record, tally):
                changed += await self._sandbox(sandbox_id, tally)
        self.applied += changed
        return changed

    def _due(self, record: SandboxRecord, tally: Tally) -> bool:
        """Whether a pass would change an interface of the sandbox (`_interface`'s test)."""
        return record.state is State.ADDED and any(
            not a.pending
            and a.result is not None
            and a.attachment.bandwidth is not None
            and self.limit_of(a.attachment, tally) != a.attachment.rate
            for a in record.attachments
        )

    async def _sandbox(self, sandbox_id: str, tally: Tally) -> int:
        async with self.locks.hold(sandbox_id):
            record = self.store.get(sandbox_id)
            if record is None or record.state is not State.ADDED:
                return 0
            attachments: list[Attached] = []
            changed = 0
            for attached in record.attachments:
                now = await self._interface(record, attached, tally)
                changed += now is not attached
                attachments.append(now)
            if changed:
                await self.store.put(replace(record, attachments=tuple(attachments)))
            return changed

    async def _interface(self, record: SandboxRecord, attached: Attached, tally: Tally) -> Attached:
        att = attached.attachment
        if attached.pending or attached.result is None or att.bandwidth is None:
            return attached
        want = self.limit_of(att, tally)
        if want == att.rate:
            return attached
        try:
            if want is None:
                await asyncio.to_thread(
                    self.shaper.remove, record.netns, att.if_name, timeout=self.timeout
                )
            else:
                await asyncio.to_thread(
                    self.shaper.apply, record.netns, att.if_name, want, timeout=self.timeout
                )
        except shaping.Gone:
            return attached  # the sandbox is going; its detach follows
        except shaping.ShapingError as exc:
            log.warning(
                "pod %s: rate limit of %s not changed to %s: %s",
                record.pod,
                att.if_name,
                want or "none",
                exc,
            )
            return attached
        log.info(
            "pod %s: %s now held to %s (was %s)",
            record.pod,
            att.if_name,
            want or "no limit",
            att.rate or "no limit",
        )
        now = replace(attached, attachment=replace(att, rate=want))
        assert now.result is not None
        self.status.put(att.claim, device_status_of(Outcome(now.attachment, Result(now.result))))
        return now
