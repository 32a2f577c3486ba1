"""apiserver clients. Every call has a timeout; nothing here is used on the NRI hook path."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import h2.connection
import httpx2
from lightkube import AsyncClient, Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.resources.core_v1 import Namespace
from lightkube.resources.resource_v1 import DeviceClass, ResourceSlice

from cnidra.kube.api import (
    Api,
    Invalid,
    NotFound,
    Transient,
    api_failure,
    get_or_none_sync,
    get_sync,
)
from cnidra.observe import metrics
from cnidra.util.backoff import Backoff

FIELD_MANAGER = "cnidra"
T = TypeVar("T")

# h2 remembers how each of a connection's last 65,536 streams closed (to tell a late frame on a
# stream it reset from a protocol error): over one long-lived apiserver connection that is
# about 10 MiB reached after some 6,000 pods, found by the soak (RSS growth per pod). A client
# with a few dozen streams in flight needs far fewer; process-wide, h2's own class setting.
h2.connection.H2Connection.MAX_CLOSED_STREAMS = 1024


class ClientConfigError(Exception):
    """No usable apiserver config: the message names where it was looked for."""


def make_client(kubeconfig: str | None, timeout: float = 10.0) -> AsyncClient:
    """From a kubeconfig file, or the in-cluster service account when none is given; every
    answered request is counted (cnidra_apiserver_requests_total). ClientConfigError when
    neither can be read."""
    try:
        config = (
            KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_service_account()
        )
    except Exception as exc:  # any kubeconfig unreadable: missing, YAML, fields, PEM
        where = (
            f"--kubeconfig {kubeconfig}"
            if kubeconfig
            else "the in-cluster service account (/var/run/secrets/kubernetes.io/serviceaccount "
            "and KUBERNETES_SERVICE_HOST): outside a pod give --kubeconfig (CNIDRA_KUBECONFIG)"
        )
        detail = f"{type(exc).__name__}: {exc}"
        raise ClientConfigError(f"no apiserver config from {where} ({detail})") from None
    # HTTP/2: a kubelet batch's claim GETs and the status writes share one TLS connection
    # instead of opening one (a handshake each) per request in flight; the watches each have
    # their own HTTP/1.1 connection (WatchingClient)
    return WatchingClient(config, timeout)


class WatchingClient(AsyncClient):
    """lightkube's client on one HTTP/2 connection, whose watches go over a second client's
    HTTP/1.1 connections, one per watch.

    httpcore's HTTP/2 connection reads the socket for every stream under one lock, and a
    stream waiting for its next frame holds that lock in a read with no timeout. A watch's
    stream waits like that for as long as nothing changes; a request whose answer another
    stream's read has already received queues behind it. With three watches on the
    connection every later request ran out of its time budget (measured on the test bed:
    a GET of a namespace answered in 4 ms with two watches open, never with three), so no
    watch shares the connection the requests use. Every answer on either is counted."""

    def __init__(self, config: KubeConfig, timeout: float) -> None:
        super().__init__(
            config=config,
            timeout=httpx2.Timeout(timeout),
            field_manager=FIELD_MANAGER,
            http2=True,
        )
        count_requests(self)
        self.watches = count_requests(
            AsyncClient(
                config=config,
                timeout=httpx2.Timeout(timeout),
                field_manager=FIELD_MANAGER,
                http2=False,
            )
        )

    def watch(self, res: Any, **kwargs: Any) -> Any:
        """lightkube's watch, on the watches' client (its arguments as lightkube's)."""
        return self.watches.watch(res, **kwargs)

    async def close(self) -> None:
        try:
            await self.watches.close()
        finally:
            await super().close()


async def _count(response: httpx2.Response) -> None:
    request = response.request
    verb, resource = metrics.request_kind(
        request.method,
        request.url.path,
        request.url.query.decode("ascii", "replace"),
        request.headers.get("content-type", ""),
    )
    metrics.APISERVER_REQUESTS.labels(verb, resource, str(response.status_code)).inc()


def count_requests(client: AsyncClient) -> AsyncClient:
    """Count each answer the client gets, by verb, resource and code, with an httpx response
    hook on the client's connection (lightkube keeps its httpx client as `_client._client`;
    a lightkube without it fails here, at start, not silently uncounted)."""
    http = client._client._client
    if not isinstance(http, httpx2.AsyncClient):
        raise TypeError(f"lightkube's HTTP client is a {type(http).__name__}, not httpx's")
    hooks = http.event_hooks
    hooks["response"] = [*hooks.get("response", []), _count]
    http.event_hooks = hooks
    return client


def make_sync_client(kubeconfig: str | None, timeout: float = 5.0) -> Client:
    """For the webhook's worker threads."""
    config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_service_account()
    return Client(config=config, timeout=httpx2.Timeout(timeout), field_manager=FIELD_MANAGER)


def device_class_reader(client: Client) -> Callable[[str], Mapping[str, Any] | None]:
    """name -> the DeviceClass as a dict, None when there is none."""

    def read(name: str) -> Mapping[str, Any] | None:
        found = get_or_none_sync(client, DeviceClass, name)
        if found is None:
            return None
        obj: dict[str, Any] = found.to_dict()
        return obj

    return read


def namespace_labels_reader(client: Client) -> Callable[[str], Mapping[str, Any] | None]:
    """name -> the namespace's labels ({} when it has none)."""

    def read(name: str) -> Mapping[str, Any] | None:
        obj = get_sync(client, Namespace, name)
        return dict(obj.metadata.labels or {}) if obj.metadata else {}

    return read


MINIMUM = (
    "cnidra needs Kubernetes 1.34 or later (resource.k8s.io/v1, Dynamic Resource Allocation); "
    "docs/supported-versions.md"
)


PROBE_SECONDS = 10.0


async def dra_api_problem(client: AsyncClient) -> str | None:
    """Why this cluster cannot run cnidra, when its apiserver says so (resource.k8s.io/v1 not
    served); None when it can or cannot be asked now (the driver starts and retries then)."""
    try:
        await Api(client).first(ResourceSlice, within=PROBE_SECONDS)
    except NotFound:
        return f"the apiserver does not serve resource.k8s.io/v1 ResourceSlices: {MINIMUM}"
    except Exception:
        return None
    return None


MAX_RETRY_WAIT = 5.0  # seconds, the longest with_retries waits between two tries


def is_transient(exc: BaseException) -> bool:
    """An apiserver answer another try may not get (cnidra.kube.api.Transient)."""
    return isinstance(api_failure(exc), Transient)


def retry_after(exc: BaseException) -> float | None:
    """The seconds a 429 or 503 asks to wait (Status.details.retryAfterSeconds), if any."""
    failure = api_failure(exc)
    return failure.retry_after if failure is not None else None


async def with_retries(
    call: Callable[[], Awaitable[T]], *, attempts: int = 4, first_delay: float = 0.2
) -> T:
    """`call` again after a transient failure (is_transient), a bounded number of times, waiting
    what the apiserver asked or the one backoff's doubling delay (cnidra.util.backoff, +-50 %
    jitter), capped at MAX_RETRY_WAIT; anything else, or the last failure, is raised."""
    backoff = Backoff(initial=first_delay, maximum=MAX_RETRY_WAIT, jitter=0.5)
    for attempt in range(attempts):
        try:
            return await call()
        except Exception as exc:
            if attempt == attempts - 1 or not is_transient(exc):
                raise
            delay = backoff.next()
            await asyncio.sleep(min(retry_after(exc) or delay, MAX_RETRY_WAIT))
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class ClusterFeatures:
    """The optional DRA fields this cluster's apiserver keeps in a ResourceSlice."""

    consumable_capacity: bool = True  # KEP-5075: device capacity, allowMultipleAllocations
    device_taints: bool = True  # KEP-5055: device taints
    known: bool = True  # False: the apiserver could not be asked; assumed on

    def left_out(self) -> list[str]:
        """What the driver leaves out on this cluster, as an operator reads it."""
        out = []
        if not self.consumable_capacity:
            out.append(
                "consumable capacity (DRAConsumableCapacity off): one claim per link device, "
                "and the scheduler does not count sub-interfaces or pool addresses"
            )
        if not self.device_taints:
            out.append(
                "device taints (DRADeviceTaints off): a failed link is not kept from the "
                "scheduler (its state attribute and the device health still say so)"
            )
        return out


def _probe_slice(node: str, driver: str, capacity: bool, taints: bool) -> ResourceSlice:
    device: dict[str, Any] = {"name": "probe"}
    if capacity:
        device["capacity"] = {
            "probe": {"value": "2", "requestPolicy": {"default": "1", "validRange": {"min": "1"}}}
        }
        device["allowMultipleAllocations"] = True
    if taints:
        device["taints"] = [{"key": f"{driver}/probe", "value": "x", "effect": "NoSchedule"}]
    made = ResourceSlice.from_dict(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-cni-dra-probe"[:253]},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": f"{node}-probe", "generation": 0, "resourceSliceCount": 1},
                "devices": [device],
            },
        }
    )
    assert isinstance(made, ResourceSlice)
    return made


async def probe_features(client: AsyncClient, node: str, driver: str) -> ClusterFeatures:
    """Which optional fields the apiserver keeps, asked with dry-run creates of a slice that
    uses them (nothing is stored): a field it drops or refuses is a feature this cluster does
    not have, and the driver leaves it out of what it writes."""
    capacity, taints = True, True
    api = Api(client)
    for _ in range(3):
        try:
            stored = await with_retries(
                functools.partial(
                    api.create, _probe_slice(node, driver, capacity, taints), dry_run=True
                )
            )
        except Invalid as exc:
            text = exc.message.lower()
            if capacity and ("capacity" in text or "allowmultipleallocations" in text):
                capacity = False
            elif taints and "taint" in text:
                taints = False
            else:
                return ClusterFeatures(known=False)
            continue
        except Exception:
            return ClusterFeatures(known=False)
        kept = (stored.spec.devices or [None])[0] if stored.spec else None
        return ClusterFeatures(
            # capacity itself predates KEP-5075: what it adds is allowMultipleAllocations
            consumable_capacity=capacity
            and kept is not None
            and bool(kept.allowMultipleAllocations),
            device_taints=taints and kept is not None and bool(kept.taints),
        )
    return ClusterFeatures(known=False)
