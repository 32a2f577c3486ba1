"""Claims read before kubelet asks (issue 42): the driver watches the pods bound to its node
(cnidra.kube.pods, the node-scoped watch kubelet itself uses); when one with resource claims is
bound, it reads those claims and judges them, and keeps each claim read in a bounded cache
(`ClaimsAhead`) with what judging it made: its typed reading, and, for a claim whose judgement
needs nothing but the node's view (no namespace labels, no named network), the judgement
itself with the view it was made on. NodePrepareResources then finds the claim there and
checks only its UID (kubelet's) and its resourceVersion (the newest this node has read of it)
instead of a GET, and takes the judgement when the node's view is still the one it was made on;
a claim not seen, stale or expired falls back to the GET it always made.

Never a weaker prepare: what is cached is the claim as the apiserver answered a GET after the
pod was bound (its allocation written and the pod in its reservedFor, or it is not kept), and
prepare judges it exactly as one it fetched, with the node as it is then: a judgement made
ahead is used only when every input of it is the one prepare would pass (the same claim
version, the same view object: the publisher keeps its view while the node does not change),
else prepare judges again (its verdicts warmed); only the GET and the repeated work are
saved. Bounded: at most `size` claims, each for `ttl` seconds; at most `max_reads` reads
pending. The watch runs as a supervised task: when it fails, prepare simply GETs."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from cnidra.api.nodes import NodeView
from cnidra.api.refs import ObjectRef
from cnidra.dra.claim import AllocatedClaim
from cnidra.observe import metrics
from cnidra.state.checkpoint import PreparedClaim
from cnidra.util.backoff import Backoff

log = logging.getLogger(__name__)

DEFAULT_SIZE = 1024  # claims kept: a node's pods' claims, with room for a burst
DEFAULT_TTL = 120.0  # seconds a claim read ahead is used; after, prepare GETs
DEFAULT_READS = 4  # claims read at once
DEFAULT_PENDING = 256  # reads waiting at most; beyond, a claim is left to prepare's GET
SEEN_PODS = 4096  # (pod, claim) pairs remembered as read: a pod's updates do not read again


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _lean(claim: Mapping[str, Any]) -> Mapping[str, Any]:
    """The claim without `metadata.managedFields`, which prepare never reads (measured: 41 % of
    a kept claim's 13.3 KB, bench.fleet)."""
    meta = claim.get("metadata")
    if not isinstance(meta, Mapping) or "managedFields" not in meta:
        return claim
    return {**claim, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class Ahead:
    """A claim read ahead as prepare takes it: the claim, and what judging it made (None: not
    judged yet, or its judgement needs more than the view)."""

    claim: Mapping[str, Any]
    typed: AllocatedClaim | None = None
    judged: PreparedClaim | None = None
    view: NodeView | None = None  # the view `judged` was made on


@dataclass(frozen=True)
class _Entry:
    uid: str
    version: str
    claim: Mapping[str, Any]
    until: float
    typed: AllocatedClaim | None = None
    judged: PreparedClaim | None = None
    view: NodeView | None = None


class ClaimsAhead:
    """Claims read ahead by UID, each with its resourceVersion; `ready(ref)` is the claim when
    it is kubelet's (same UID), the newest this node read (same resourceVersion) and not
    expired, else None (the caller GETs). Bounded (least recently stored dropped)."""

    def __init__(
        self,
        size: int = DEFAULT_SIZE,
        ttl: float = DEFAULT_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.size = size
        self.ttl = ttl
        self.clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._uids: dict[tuple[str, str], str] = {}  # (namespace, name) -> UID stored
        # UID -> the newest resourceVersion read of a claim kept: only theirs, as only theirs
        # is ever compared (a put records its own version; one read before it is overridden)
        self._newest: dict[str, str] = {}
        # (namespace, name) -> the read of it under way (its GET started): prepare waits for it
        # rather than GET the claim a second time
        self._reading: dict[tuple[str, str], asyncio.Task[None]] = {}
        # claims prepare read itself while their read ahead waited for a slot: that read is not
        # made (bounded; forgotten when the claim is to be read again)
        self._got: OrderedDict[tuple[str, str], None] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.stale = 0

    def __len__(self) -> int:
        return len(self._entries)

    def seen(self, claim: Mapping[str, Any]) -> None:
        """A claim as the apiserver answered any read of it now (prepare's GET too): an entry
        of another resourceVersion is stale from here on. A claim not kept is not remembered
        (prepare GETs every claim it does not find: 1,000 claims held 0.1 MiB of versions
        never read)."""
        meta = _meta(claim)
        uid = _str(meta.get("uid"))
        if uid in self._entries:
            self._newest[uid] = _str(meta.get("resourceVersion"))

    def reading(self, namespace: str, name: str) -> asyncio.Task[None] | None:
        """The read ahead of this claim under way (its GET started), if any."""
        return self._reading.get((namespace, name))

    def begin_read(self, namespace: str, name: str, task: asyncio.Task[None]) -> bool:
        """A read ahead of the claim starts its GET (prepare waits for it from here), unless
        prepare read the claim itself meanwhile (False: the read is not made)."""
        if (namespace, name) in self._got:
            return False
        self._reading[(namespace, name)] = task
        return True

    def end_read(self, namespace: str, name: str, task: asyncio.Task[None]) -> None:
        if self._reading.get((namespace, name)) is task:
            del self._reading[(namespace, name)]

    def got(self, namespace: str, name: str) -> None:
        """Prepare read the claim itself: a read ahead of it still waiting is not made."""
        self._got[(namespace, name)] = None
        while len(self._got) > self.size:
            self._got.popitem(last=False)

    def _drop(self, uid: str) -> _Entry | None:
        self._newest.pop(uid, None)
        return self._entries.pop(uid, None)

    def put(self, claim: Mapping[str, Any]) -> bool:
        """Keep a claim read after its pod was bound; whether it was kept."""
        meta = _meta(claim)
        uid, version = _str(meta.get("uid")), _str(meta.get("resourceVersion"))
        namespace, name = _str(meta.get("namespace")), _str(meta.get("name"))
        if not uid or not version or not name:
            return False
        old = self._uids.get((namespace, name))
        if old is not None and old != uid:
            self._drop(old)
        self._uids[(namespace, name)] = uid
        now = self.clock()
        self._entries[uid] = _Entry(uid, version, _lean(claim), now + self.ttl)
        self._entries.move_to_end(uid)
        self._newest[uid] = version
        # the oldest first: the expired ones, then any beyond the bound
        while self._entries and (
            len(self._entries) > self.size or next(iter(self._entries.values())).until <= now
        ):
            dropped = self._drop(next(iter(self._entries)))
            assert dropped is not None
            meta = _meta(dropped.claim)
            self._uids.pop((_str(meta.get("namespace")), _str(meta.get("name"))), None)
        return True

    def judged(
        self,
        claim: Mapping[str, Any],
        typed: AllocatedClaim,
        judged: PreparedClaim | None,
        view: NodeView | None,
    ) -> None:
        """What judging `claim` made, kept with it: only while the entry is this very version
        of the claim (a newer one put since is not given an older judgement). The claim's
        text is then let go: prepare reads the typed claim."""
        meta = _meta(claim)
        uid = _str(meta.get("uid"))
        entry = self._entries.get(uid)
        if entry is None or entry.version != _str(meta.get("resourceVersion")):
            return
        # the typed reading stands for the claim from here on: its whole text is let go
        stub = {"metadata": {k: meta.get(k) for k in ("namespace", "name", "uid")}}
        self._entries[uid] = replace(entry, claim=stub, typed=typed, judged=judged, view=view)

    def forget(self, namespace: str, name: str) -> None:
        """The claim is being read again (another pod bound to it): not used until then."""
        self._got.pop((namespace, name), None)
        uid = self._uids.pop((namespace, name), None)
        if uid is not None:
            self._drop(uid)

    def ready(self, ref: ObjectRef) -> Ahead | None:
        entry = self._entries.get(ref.uid)
        meta = _meta(entry.claim) if entry is not None else {}
        if entry is None or (_str(meta.get("namespace")), _str(meta.get("name"))) != (
            ref.namespace,
            ref.name,
        ):
            self.misses += 1
            metrics.CLAIMS_AHEAD.labels("miss").inc()
            return None
        if entry.until <= self.clock() or self._newest.get(ref.uid) != entry.version:
            self._drop(ref.uid)
            if self._uids.get((ref.namespace, ref.name)) == ref.uid:
                del self._uids[(ref.namespace, ref.name)]
            self.stale += 1
            metrics.CLAIMS_AHEAD.labels("stale").inc()
            return None
        self.hits += 1
        metrics.CLAIMS_AHEAD.labels("hit").inc()
        # used once: kubelet prepares a claim once (again after its own restart, which GETs)
        self._drop(ref.uid)
        if self._uids.get((ref.namespace, ref.name)) == ref.uid:
            del self._uids[(ref.namespace, ref.name)]
        return Ahead(entry.claim, entry.typed, entry.judged, entry.view)


def claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The ResourceClaims a pod uses: those its spec names (`resourceClaimName`) and those made
    for it from templates (`status.resourceClaimStatuses`), each once, in order."""
    names: list[str] = []
    spec = pod.get("spec")
    status = pod.get("status")
    claims = spec.get("resourceClaims") if isinstance(spec, Mapping) else None
    statuses = status.get("resourceClaimStatuses") if isinstance(status, Mapping) else None
    for item in [
        *(claims if isinstance(claims, list) else []),
        *(statuses if isinstance(statuses, list) else []),
    ]:
        name = item.get("resourceClaimName") if isinstance(item, Mapping) else None
        if isinstance(name, str) and name and name not in names:
            names.append(name)
    return names


def _reserved_for(claim: Mapping[str, Any], pod_uid: str) -> bool:
    status = claim.get("status")
    if not isinstance(status, Mapping) or not status.get("allocation"):
        return False
    reserved = status.get("reservedFor")
    return any(
        isinstance(r, Mapping) and r.get("uid") == pod_uid
        for r in (reserved if isinstance(reserved, list) else [])
    )


class Claims(Protocol):
    async def get(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...


class ReadAhead:
    """The watch of the node's pods, and the reads and judgements it starts."""

    def __init__(
        self,
        pods: Callable[[], AsyncIterator[tuple[str, Mapping[str, Any]]]],
        claims: Claims,
        cache: ClaimsAhead,
        judge: Callable[[Mapping[str, Any]], Awaitable[None]] | None = None,
        *,
        max_reads: int = DEFAULT_READS,
        max_pending: int = DEFAULT_PENDING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pods = pods
        self.claims = claims
        self.cache = cache
        self.judge = judge
        self.max_pending = max_pending
        self._slots = asyncio.Semaphore(max_reads)
        self._reading: set[asyncio.Task[None]] = set()
        self._read: OrderedDict[tuple[str, str], None] = OrderedDict()  # (pod UID, claim)
        self._read_of: dict[str, list[tuple[str, str]]] = {}  # pod UID -> its keys in _read
        self.clock = clock
        self.reads = 0
        self.watch_failures = 0
        self.failed = 0
        self.skipped = 0
        self.late = 0  # reads not made: prepare read the claim first

    async def run(self) -> None:
        """Watch for as long as the driver runs: a watch the apiserver ends (as it does) or that
        fails is started again on the one backoff (one that ran a minute had worked); between
        watches, prepare GETs. A bug here is the Supervisor's to restart."""
        backoff = Backoff(initial=1.0, maximum=60.0)
        while True:
            started = self.clock()
            try:
                await self.watch_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.watch_failures += 1
                log.info("the watch of the node's pods ended (%s); prepare GETs meanwhile", exc)
            await asyncio.sleep(backoff.after_run(self.clock() - started, settled=60.0))

    async def watch_once(self) -> None:
        """One watch, until the apiserver ends it (returns) or it fails (raises)."""
        try:
            async for event, pod in self.pods():
                self.on_pod(event, pod)
        except asyncio.CancelledError:  # the driver stops: its reads with it
            for task in list(self._reading):
                task.cancel()
            raise

    def on_pod(self, event: str, pod: Mapping[str, Any]) -> None:
        meta = _meta(pod)
        pod_uid, namespace = _str(meta.get("uid")), _str(meta.get("namespace"))
        if event == "DELETED":
            for key in self._read_of.pop(pod_uid, ()):
                self._read.pop(key, None)
            return
        status = pod.get("status")
        phase = status.get("phase") if isinstance(status, Mapping) else None
        # only a pod still starting: a running one's claims were prepared (a watch that starts
        # again lists every pod of the node, and reads none of theirs)
        if not pod_uid or meta.get("deletionTimestamp") or phase not in (None, "", "Pending"):
            return
        for name in claim_names(pod):
            key = (pod_uid, f"{namespace}/{name}")
            if key in self._read:
                continue
            if len(self._reading) >= self.max_pending:
                self.skipped += 1  # prepare GETs it
                continue
            self._read[key] = None
            self._read_of.setdefault(pod_uid, []).append(key)
            while len(self._read) > SEEN_PODS:
                (uid, _), _ = self._read.popitem(last=False)
                keys = self._read_of.get(uid)
                if keys is not None:
                    keys[:] = [k for k in keys if k in self._read]
                    if not keys:
                        del self._read_of[uid]
            self.cache.forget(namespace, name)
            task = asyncio.create_task(self._read_claim(namespace, name, pod_uid))
            self._reading.add(task)
            task.add_done_callback(self._reading.discard)

    async def _read_claim(self, namespace: str, name: str, pod_uid: str) -> None:
        async with self._slots:
            task = asyncio.current_task()
            if task is None or not self.cache.begin_read(namespace, name, task):
                self.late += 1  # prepare read it while this waited: not read twice
                return
            try:
                await self._fetch(namespace, name, pod_uid)
            finally:
                self.cache.end_read(namespace, name, task)

    async def _fetch(self, namespace: str, name: str, pod_uid: str) -> None:
        try:
            claim = await self.claims.get(namespace, name)
        except Exception as exc:  # prepare GETs it
            self.failed += 1
            log.debug("claim %s/%s not read ahead: %s", namespace, name, exc)
            return
        self.reads += 1
        if claim is None or not _reserved_for(claim, pod_uid):
            return
        if not self.cache.put(claim):
            return
        if self.judge is not None:
            try:
                await self.judge(claim)
            except Exception as exc:  # prepare judges it, and says what is wrong
                log.debug("claim %s/%s not judged ahead: %s", namespace, name, exc)

    async def drained(self) -> None:
        """Every read started so far finished (tests)."""
        while self._reading:
            await asyncio.gather(*self._reading, return_exceptions=True)
