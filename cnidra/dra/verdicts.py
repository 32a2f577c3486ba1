"""Prepare's memory of verdicts: `check_request`'s answers kept by the content of what it
judged (cnidra.api.verdict), so the pods of one template are judged once. Only prepare uses it
(cnidra.dra.prepare, through cnidra.dra.resolve)."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace

from cnidra.api.issues import FieldPath, Issue, Issues
from cnidra.api.merge import ConfigEntry, applicable
from cnidra.api.networks import NamedNetwork, NetworkCatalog
from cnidra.api.verdict import ResolvedRequest, check_request


class NotCached(Exception):
    """Within `cached_only()`: a verdict this cache does not hold (or would not keep)."""


_CACHED_ONLY: ContextVar[bool] = ContextVar("cnidra_verdicts_cached_only", default=False)


@contextmanager
def cached_only() -> Iterator[None]:
    """Within it, `check_request` answers only from the cache and raises NotCached for a
    verdict it would have to judge: prepare then judges the claim the usual way, off the loop
    within its budget (cnidra.dra.prepare). A claim all of whose verdicts are kept has configs
    of at most `max_key_chars` each, so what is left of its judgement is small."""
    token = _CACHED_ONLY.set(True)
    try:
        yield
    finally:
        _CACHED_ONLY.reset(token)


class VerdictCache:
    """`check_request`'s verdicts by the content of what it judged, for prepare: the pods of one
    template carry the same configs, and the decoding, the policy and the validator (most of a
    prepare's CPU after the claim's GET) then run once per distinct config, not once per pod.

    Exact, never a weaker check: the key is a digest of everything the verdict reads (the
    request, the namespace and its labels, the anchor path, and each config that applies to the
    request with its source, requests, path and parameters, in DRA order), over their `repr`,
    which for JSON data (all a claim holds) tells apart every two values Python and the plugins
    could read differently (a list from a tuple, 1 from 1.0 from True, key order); a config that
    differs in any byte is judged anew. What is cached is the verdict and every issue it
    reported, handed out again as reported. Named networks (a catalog, a network device) are
    read afresh at every prepare, so a request that references one is never cached.

    Bounded, whatever tenants write: at most `size` verdicts (least recently used dropped), and
    configs whose key text exceeds `max_key_chars` (real ones are a few KiB; a config may be
    64 KiB, cnidra.api.parameters) are judged every time, not kept. Safe to use from worker
    threads (prepare judges in them): the table is behind a lock, held only to look up and to
    keep, never while judging (two threads may judge one config at once; one verdict is kept)."""

    def __init__(self, size: int = 128, max_key_chars: int = 16 * 1024) -> None:
        self.size = size
        self.max_key_chars = max_key_chars
        self._verdicts: OrderedDict[bytes, tuple[ResolvedRequest | None, tuple[Issue, ...]]] = (
            OrderedDict()
        )
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._verdicts)

    def check_request(
        self,
        entries: Sequence[ConfigEntry],
        request: str,
        namespace: str,
        labels: Mapping[str, str] | None,
        issues: Issues,
        where: FieldPath,
        *,
        class_known: bool = True,
        catalog: NetworkCatalog | None = None,
        device_network: NamedNetwork | None = None,
    ) -> ResolvedRequest | None:
        key = None
        if catalog is None and device_network is None:
            key = self._key(entries, request, namespace, labels, where, class_known)
        found = None
        with self._lock:
            if key is not None:
                found = self._verdicts.get(key)
            if found is not None:
                self.hits += 1
                assert key is not None
                self._verdicts.move_to_end(key)
            elif _CACHED_ONLY.get():
                raise NotCached(request)
            else:
                self.misses += 1
        if found is None:
            told = Issues()
            resolved = check_request(
                entries,
                request,
                namespace,
                labels,
                told,
                where,
                class_known=class_known,
                catalog=catalog,
                device_network=device_network,
            )
            found = (resolved, tuple(told.items))
            if key is not None:
                with self._lock:
                    self._verdicts[key] = found
                    while len(self._verdicts) > self.size:
                        self._verdicts.popitem(last=False)
        resolved, told_items = found
        issues.extend(told_items)
        # a copy: callers set attributes of theirs (the request's interface name, its slot)
        return replace(resolved) if resolved is not None else None

    def _key(
        self,
        entries: Sequence[ConfigEntry],
        request: str,
        namespace: str,
        labels: Mapping[str, str] | None,
        where: FieldPath,
        class_known: bool,
    ) -> bytes | None:
        text = repr(
            (
                request,
                namespace,
                None if labels is None else sorted(labels.items()),
                where.segments,
                class_known,
                # the configs that apply to the request, in DRA order: all the verdict reads
                [
                    (str(e.source), e.requests, e.path.segments, e.parameters)
                    for e in applicable(entries, request)
                ],
            )
        )
        if len(text) > self.max_key_chars:
            return None
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
