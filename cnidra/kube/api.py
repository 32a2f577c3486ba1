"""The one apiserver layer: every call another package makes to the apiserver goes through
`Api` (get-or-none, list, apply, patch, create, delete, watch, each with a timeout), and every
failure it raises is one of the `ApiFailure` classes below, decided by `classify` alone.

Objects are plain dicts, as the apiserver's JSON decodes; the kinds the others name are
`Resource`s defined here (`Pod`, `ResourceClaim`, ...), and the client type they are handed
(cnidra.kube.session's one aiohttp session) is re-exported here."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, TypeVar

import aiohttp

from cnidra.kube.session import (
    ALL_NAMESPACES,
    ApiStatus,
    AsyncClient,
    Client,
    Resource,
    cluster_wide,
    namespaced,
)

Pod = namespaced("", "v1", "Pod", "pods")
Node = cluster_wide("", "v1", "Node", "nodes")
Namespace = cluster_wide("", "v1", "Namespace", "namespaces")
Event = namespaced("", "v1", "Event", "events")
Lease = namespaced("coordination.k8s.io", "v1", "Lease", "leases")
DeviceClass = cluster_wide("resource.k8s.io", "v1", "DeviceClass", "deviceclasses")
ResourceClaim = namespaced("resource.k8s.io", "v1", "ResourceClaim", "resourceclaims")
ResourceClaimStatus = ResourceClaim.Status
ResourceSlice = cluster_wide("resource.k8s.io", "v1", "ResourceSlice", "resourceslices")

__all__ = [
    "ALL_NAMESPACES",
    "Api",
    "ApiFailure",
    "AsyncClient",
    "Client",
    "Conflict",
    "DeviceClass",
    "Event",
    "Invalid",
    "Lease",
    "Namespace",
    "Node",
    "NotFound",
    "Pod",
    "RefusedForGood",
    "Resource",
    "ResourceClaim",
    "ResourceClaimStatus",
    "ResourceSlice",
    "Transient",
    "UidPrecondition",
    "api_failure",
    "classify",
    "cluster_wide",
    "get_or_none_sync",
    "get_sync",
    "namespaced",
]

T = TypeVar("T")
DEFAULT_TIMEOUT = 10.0


class ApiFailure(Exception):
    """An apiserver call that failed: its answer's code and message (code None: no answer, the
    connection failed or the call timed out). A failure of this class itself, not of a subclass,
    is none of the kinds below (401, 501, ...): not retried, not dropped as refused."""

    def __init__(self, code: int | None, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"({code}) {message}" if code is not None else message)
        self.code = code
        self.message = message
        self.retry_after = retry_after  # seconds a 429 or 503 asked to wait


class Transient(ApiFailure):
    """Another try may get another answer: throttled (429, API Priority and Fairness), starting
    up ("storage is (re)initializing", 500/503), a proxy's 502/504, or no answer at all (the
    connection failed, the call timed out)."""


class RefusedForGood(ApiFailure):
    """No retry changes the answer: bad request, forbidden (a policy, a terminating namespace),
    not found, method not allowed, gone, too large, unsupported media type, invalid, or a UID
    precondition of an object deleted and made again."""


class NotFound(RefusedForGood):
    """404: the object (or its kind: a CRD not installed) is not there."""


class Invalid(RefusedForGood):
    """422: invalid, or a JSON patch whose `test` failed."""


class Conflict(ApiFailure):
    """409: a resourceVersion precondition failed, or the object exists already."""


class UidPrecondition(Conflict, RefusedForGood):
    """409 on a UID precondition: the object was deleted and made again; a conflict that no
    retry resolves."""


TRANSIENT_CODES = frozenset({429, 500, 502, 503, 504})
REFUSED_CODES = frozenset({400, 403, 405, 410, 413, 415})


def classify(code: int | None, message: str = "") -> type[ApiFailure]:
    """The one table from an apiserver's answer to a failure kind (code None: no answer)."""
    if code is None or code in TRANSIENT_CODES:
        return Transient
    if code == 404:
        return NotFound
    if code == 422:
        return Invalid
    if code == 409:
        return UidPrecondition if "uid" in message.lower() else Conflict
    if code in REFUSED_CODES:
        return RefusedForGood
    return ApiFailure


def api_failure(exc: BaseException) -> ApiFailure | None:
    """The ApiFailure an exception of an apiserver call is (None: not the apiserver's, such as
    a bug, a cancellation, or a decoding error, which pass through unchanged)."""
    if isinstance(exc, ApiFailure):
        return exc
    if isinstance(exc, ApiStatus):
        return classify(exc.code, exc.message)(exc.code, exc.message, exc.retry_after)
    if isinstance(exc, aiohttp.ClientError | OSError | TimeoutError):
        return Transient(None, f"{type(exc).__name__}: {exc}")
    return None


def _raise_as_failure(exc: BaseException) -> None:
    failure = api_failure(exc)
    if failure is not None and failure is not exc:
        raise failure from exc


class Api:
    """A client of the apiserver with a timeout on every call and the failures as ApiFailure.
    `client`: cnidra.kube.session's AsyncClient (or a test's stand-in with its methods)."""

    def __init__(self, client: Any, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.client = client
        self.timeout = timeout

    async def _call(self, awaitable: Any, within: float | None) -> Any:
        try:
            async with asyncio.timeout(self.timeout if within is None else within):
                return await awaitable
        except (ApiStatus, aiohttp.ClientError, OSError, TimeoutError) as exc:
            _raise_as_failure(exc)
            raise

    async def get(
        self,
        kind: Resource,
        name: str,
        namespace: str | None = None,
        *,
        within: float | None = None,
    ) -> Any:
        """The object; NotFound when there is none."""
        kwargs = {} if namespace is None else {"namespace": namespace}
        return await self._call(self.client.get(kind, name, **kwargs), within)

    async def get_or_none(
        self,
        kind: Resource,
        name: str,
        namespace: str | None = None,
        *,
        within: float | None = None,
    ) -> Any | None:
        """The object, or None when there is none (404)."""
        try:
            return await self.get(kind, name, namespace, within=within)
        except NotFound:
            return None

    async def list(
        self,
        kind: Resource,
        *,
        namespace: str | None = None,
        labels: Mapping[str, Any] | None = None,
        fields: Mapping[str, Any] | None = None,
        within: float | None = None,
        missing_is_empty: bool = False,
    ) -> list[Any]:
        """Every object of the kind (within the timeout, paging included); `missing_is_empty`:
        [] when the kind is not served (a CRD not installed)."""
        kwargs: dict[str, Any] = {}
        if namespace is not None:
            kwargs["namespace"] = namespace
        if labels is not None:
            kwargs["labels"] = labels
        if fields is not None:
            kwargs["fields"] = fields

        async def gather() -> list[Any]:
            return [obj async for obj in self.client.list(kind, **kwargs)]

        try:
            result: list[Any] = await self._call(gather(), within)
        except NotFound:
            if missing_is_empty:
                return []
            raise
        return result

    async def first(self, kind: Resource, *, within: float | None = None) -> None:
        """One page of one object: whether the kind is served (NotFound when not)."""

        async def one() -> None:
            async for _ in self.client.list(kind, chunk_size=1):
                break

        await self._call(one(), within)

    async def create(
        self,
        kind: Resource,
        body: Mapping[str, Any],
        *,
        namespace: str | None = None,
        within: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """The object made (`dry_run=True`: as it would be, nothing stored); Conflict when it
        exists already. `namespace`: the body's own when not given."""
        if namespace is not None:
            kwargs["namespace"] = namespace
        return await self._call(self.client.create(kind, body, **kwargs), within)

    async def delete(
        self,
        kind: Resource,
        name: str,
        namespace: str | None = None,
        *,
        within: float | None = None,
    ) -> bool:
        """Whether it was there (False: 404, nothing to delete)."""
        kwargs = {} if namespace is None else {"namespace": namespace}
        try:
            await self._call(self.client.delete(kind, name, **kwargs), within)
        except NotFound:
            return False
        return True

    async def apply(
        self,
        kind: Resource,
        name: str,
        body: Mapping[str, Any],
        *,
        namespace: str | None = None,
        field_manager: str | None = None,
        force: bool = True,
        within: float | None = None,
    ) -> Any:
        """Server-side apply of `body` (a dict) under `field_manager`."""
        kwargs: dict[str, Any] = {"patch_type": "apply", "force": force}
        if namespace is not None:
            kwargs["namespace"] = namespace
        if field_manager is not None:
            kwargs["field_manager"] = field_manager
        return await self._call(self.client.patch(kind, name, body, **kwargs), within)

    async def apply_object(
        self, kind: Resource, body: Mapping[str, Any], *, within: float | None = None
    ) -> Any:
        """Server-side apply of a whole object given as a dict, with the client's field
        manager."""
        meta = body.get("metadata") or {}
        return await self.apply(
            kind, str(meta["name"]), body, namespace=meta.get("namespace"), within=within
        )

    async def merge_patch(
        self,
        kind: Resource,
        name: str,
        body: Mapping[str, Any],
        *,
        namespace: str | None = None,
        within: float | None = None,
    ) -> Any:
        kwargs: dict[str, Any] = {"patch_type": "merge"}
        if namespace is not None:
            kwargs["namespace"] = namespace
        return await self._call(self.client.patch(kind, name, body, **kwargs), within)

    async def json_patch(
        self,
        kind: Resource,
        name: str,
        ops: Sequence[Mapping[str, Any]],
        *,
        namespace: str | None = None,
        within: float | None = None,
    ) -> Any:
        kwargs: dict[str, Any] = {"patch_type": "json"}
        if namespace is not None:
            kwargs["namespace"] = namespace
        return await self._call(self.client.patch(kind, name, list(ops), **kwargs), within)

    async def watch(
        self,
        kind: Resource,
        *,
        namespace: str | None = None,
        fields: Mapping[str, Any] | None = None,
    ) -> AsyncIterator[tuple[str, Any]]:
        """The kind's changes, as the apiserver streams them (no timeout: a watch lasts until
        the apiserver ends it; its failure is an ApiFailure). `namespace`: of a namespaced
        kind ("*": every namespace; none: the client's own); `fields`: a field selector, so
        the apiserver sends only what matches."""
        kwargs: dict[str, Any] = {} if fields is None else {"fields": dict(fields)}
        if namespace is not None:
            kwargs["namespace"] = namespace
        try:
            async for event, obj in self.client.watch(kind, **kwargs):
                yield event, obj
        except (ApiStatus, aiohttp.ClientError, OSError, TimeoutError) as exc:
            _raise_as_failure(exc)
            raise


def get_sync(client: Client, kind: Resource, name: str) -> Any:
    """A synchronous client's GET (the webhook's worker threads; the client's own timeout), any
    failure as an ApiFailure."""
    try:
        return client.get(kind, name)
    except (ApiStatus, aiohttp.ClientError, OSError, TimeoutError) as exc:
        _raise_as_failure(exc)
        raise


def get_or_none_sync(client: Client, kind: Resource, name: str) -> Any | None:
    """get_sync, None when there is none (404)."""
    try:
        return get_sync(client, kind, name)
    except NotFound:
        return None
