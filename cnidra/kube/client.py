"""apiserver clients. Every call has a timeout; nothing here is used on the NRI hook path."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from cnidra.kube.api import (
    Api,
    AsyncClient,
    Client,
    DeviceClass,
    Invalid,
    Namespace,
    NotFound,
    ResourceSlice,
    Transient,
    api_failure,
    get_or_none_sync,
    get_sync,
)
from cnidra.kube.session import LIMIT, KubeConfig
from cnidra.util.backoff import Backoff

FIELD_MANAGER = "cnidra"
T = TypeVar("T")


class ClientConfigError(Exception):
    """No usable apiserver config: the message names where it was looked for."""


def _config(kubeconfig: str | None) -> KubeConfig:
    try:
        return KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_service_account()
    except Exception as exc:  # any kubeconfig unreadable: missing, YAML, fields, PEM
        where = (
            f"--kubeconfig {kubeconfig}"
            if kubeconfig
            else "the in-cluster service account (/var/run/secrets/kubernetes.io/serviceaccount "
            "and KUBERNETES_SERVICE_HOST): outside a pod give --kubeconfig (CNIDRA_KUBECONFIG)"
        )
        detail = f"{type(exc).__name__}: {exc}"
        raise ClientConfigError(f"no apiserver config from {where} ({detail})") from None


def make_client(kubeconfig: str | None, timeout: float = 10.0) -> AsyncClient:
    """From a kubeconfig file, or the in-cluster service account when none is given: one
    aiohttp session (cnidra.kube.session), HTTP/1.1 keep-alive over at most LIMIT connections
    for requests (and WATCHES for watches), every answered request counted
    (cnidra_apiserver_requests_total). ClientConfigError when neither can be read."""
    return AsyncClient(_config(kubeconfig), timeout, FIELD_MANAGER, LIMIT)


def make_sync_client(kubeconfig: str | None, timeout: float = 5.0) -> Client:
    """For the webhook's worker threads (http.client over the same TLS context)."""
    return Client(_config(kubeconfig), timeout)


def device_class_reader(client: Client) -> Callable[[str], Mapping[str, Any] | None]:
    """name -> the DeviceClass as a dict, None when there is none."""

    def read(name: str) -> Mapping[str, Any] | None:
        found = get_or_none_sync(client, DeviceClass, name)
        if found is None:
            return None
        obj: dict[str, Any] = found
        return obj

    return read


def namespace_labels_reader(client: Client) -> Callable[[str], Mapping[str, Any] | None]:
    """name -> the namespace's labels ({} when it has none)."""

    def read(name: str) -> Mapping[str, Any] | None:
        obj = get_sync(client, Namespace, name)
        return dict((obj.get("metadata") or {}).get("labels") or {})

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


def _probe_slice(node: str, driver: str, capacity: bool, taints: bool) -> dict[str, Any]:
    device: dict[str, Any] = {"name": "probe"}
    if capacity:
        device["capacity"] = {
            "probe": {"value": "2", "requestPolicy": {"default": "1", "validRange": {"min": "1"}}}
        }
        device["allowMultipleAllocations"] = True
    if taints:
        device["taints"] = [{"key": f"{driver}/probe", "value": "x", "effect": "NoSchedule"}]
    return {
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
                    api.create,
                    ResourceSlice,
                    _probe_slice(node, driver, capacity, taints),
                    dry_run=True,
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
        kept = ((stored.get("spec") or {}).get("devices") or [None])[0]
        return ClusterFeatures(
            # capacity itself predates KEP-5075: what it adds is allowMultipleAllocations
            consumable_capacity=capacity
            and kept is not None
            and bool(kept.get("allowMultipleAllocations")),
            device_taints=taints and kept is not None and bool(kept.get("taints")),
        )
    return ClusterFeatures(known=False)
