"""The pod's `k8s.v1.cni.cncf.io/network-status` annotation (Multus' format), for readers of
it: cnidra's entries replace its earlier ones, every other writer's entry stays. Each pod is a
key of the status writer's queue, due once, retried on its own backoff. The annotation is one
JSON patch, tested against the annotations the runtime gave with the sandbox (kubelet copies
the pod's into it); when the test fails (another writer, such as Multus, wrote since) the pod
is read and merged. The annotation is tenant input: read with a size and depth bound, and
anything but a list of objects is replaced."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cnidra.api.loading import LoadError, load_json
from cnidra.api.refs import ObjectRef
from cnidra.kube.api import Api, Invalid, NotFound, Pod, RefusedForGood
from cnidra.observe import metrics
from cnidra.status.devices import NETWORK_STATUS_ANNOTATION, NetworkStatus
from cnidra.util.workqueue import Lane

log = logging.getLogger(__name__)

ANNOTATION_MAX_BYTES = 256 * 1024  # a network-status annotation larger is not read
_ANNOTATION_PATH = "/metadata/annotations/" + NETWORK_STATUS_ANNOTATION.replace("~", "~0").replace(
    "/", "~1"
)


@dataclass(frozen=True)
class SeenAnnotations:
    """The pod's annotations as the runtime gave them with its sandbox (NRI's PodSandbox;
    kubelet makes the sandbox's annotations the pod's: kuberuntime_sandbox.go:95, labels.go:92
    in Kubernetes 1.37): its network-status annotation then (None: it had none), and whether it
    had any annotation at all (none: the map may not exist in the object)."""

    network_status: str | None
    any: bool


class PodNetworksWriter:
    """`timeout`: how long one pod's write may take."""

    def __init__(
        self, api: Api | None, lane: Lane[ObjectRef], wake: Callable[[], None], timeout: float
    ) -> None:
        self.api = api
        self.lane = lane
        self.wake = wake
        self.timeout = timeout
        # pod -> its cnidra interfaces as network-status entries, waiting to be written
        self.networks: dict[ObjectRef, Sequence[NetworkStatus]] = {}
        self.seen: dict[ObjectRef, SeenAnnotations] = {}
        # whether the annotations the runtime gives are fresh enough to patch against: off
        # after a test failed (another writer of the annotation on this node's pods: a GET
        # first saves the failed patch), on again when a read shows the runtime's view held
        self.patch_seen = True
        self.written_interfaces: dict[ObjectRef, set[str]] = {}

    def pod_networks(
        self,
        pod: ObjectRef,
        statuses: Sequence[NetworkStatus],
        seen: SeenAnnotations | None = None,
    ) -> None:
        """`seen`: the pod's annotations as its sandbox came with them; without them (a
        restart, the node API's plugs) the pod is read first."""
        self.networks[pod] = statuses
        if seen is None:
            self.seen.pop(pod, None)
        else:
            self.seen[pod] = seen
        self.lane.add(pod)  # a new change is due now, whatever the last one's backoff
        self.wake()

    def pod_gone(self, pod: ObjectRef) -> None:
        """The pod has no sandbox on this node any more: which of its interfaces were written
        into its annotation need not be remembered (kept for every pod that ever ran, it grew
        with each pod of a node's life)."""
        self.written_interfaces.pop(pod, None)

    def pending(self) -> int:
        return len(self.networks)

    async def write_due(self) -> None:
        """Each pod due on its own backoff: one pod's failure never holds up another's."""
        if not self.networks:
            return
        for pod in self.lane.due():
            statuses = self.networks[pod]
            try:
                async with asyncio.timeout(self.timeout):
                    await self._annotate(pod, statuses, self.seen.get(pod))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if isinstance(exc, RefusedForGood):
                    log.warning(
                        "network-status of pod %s/%s refused (%s); not retried",
                        pod.namespace, pod.name, exc,
                    )  # fmt: skip
                    metrics.POD_WRITES.labels("network-status", "refused").inc()
                    self._forget_pod(pod, statuses)
                    continue
                metrics.POD_WRITES.labels("network-status", "error").inc()
                delay = self.lane.retry(pod)
                log.warning(
                    "network-status of pod %s/%s not written (%s); retry in %.1fs",
                    pod.namespace, pod.name, exc, delay,
                )  # fmt: skip
                continue
            metrics.POD_WRITES.labels("network-status", "ok").inc()
            self._forget_pod(pod, statuses)

    def _forget_pod(self, pod: ObjectRef, statuses: Sequence[NetworkStatus]) -> None:
        self.lane.done(pod)
        if self.networks.get(pod) is statuses:  # not replaced meanwhile
            del self.networks[pod]
            self.seen.pop(pod, None)
        elif pod in self.networks:  # replaced meanwhile: the new change is due now
            self.lane.add(pod)

    async def _annotate(
        self, pod: ObjectRef, statuses: Sequence[NetworkStatus], seen: SeenAnnotations | None
    ) -> None:
        if self.api is None:
            return
        if seen is not None and self.patch_seen and await self._patch_against(pod, statuses, seen):
            return
        obj = await self.api.get_or_none(Pod, pod.name, pod.namespace)
        if obj is None:
            self.written_interfaces.pop(pod, None)
            return
        meta = obj.get("metadata") or {}
        if meta.get("uid") != pod.uid:
            self.written_interfaces.pop(pod, None)
            return  # another pod of the same name now
        if meta.get("deletionTimestamp") is not None:
            self.written_interfaces.pop(pod, None)
            return  # going away: nobody reads its networks any more
        ours = {s.interface for s in statuses} | self.written_interfaces.get(pod, set())
        current = (meta.get("annotations") or {}).get(NETWORK_STATUS_ANNOTATION)
        if seen is not None and current == seen.network_status:
            self.patch_seen = True  # the runtime's view held: patch against it again
        kept = other_entries(current, ours, pod)
        patch = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": {
                    NETWORK_STATUS_ANNOTATION: _dumps([*kept, *(s.entry() for s in statuses)])
                },
            }
        }
        await self.api.merge_patch(Pod, pod.name, patch, namespace=pod.namespace)
        self._wrote(pod, statuses)

    def _wrote(self, pod: ObjectRef, statuses: Sequence[NetworkStatus]) -> None:
        if statuses:
            self.written_interfaces[pod] = {s.interface for s in statuses}
        else:
            self.written_interfaces.pop(pod, None)

    async def _patch_against(
        self, pod: ObjectRef, statuses: Sequence[NetworkStatus], seen: SeenAnnotations
    ) -> bool:
        """One JSON patch instead of a GET and a merge patch: it tests that the pod is this
        one, not being deleted, and that its annotation is still what the runtime gave (a test
        for null passes on a member that is missing: evanphx/json-patch v4.13.0 patch.go:689,
        what the apiserver applies), then sets it. False when a test failed (422: apiserver
        pkg/endpoints/handlers/patch.go:425): the caller reads the pod and merges."""
        assert self.api is not None
        ours = {s.interface for s in statuses} | self.written_interfaces.get(pod, set())
        value = _dumps(
            [*other_entries(seen.network_status, ours, pod), *(s.entry() for s in statuses)]
        )
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": "/metadata/uid", "value": pod.uid},
            {"op": "test", "path": "/metadata/deletionTimestamp", "value": None},
        ]
        if seen.any:
            ops.append({"op": "test", "path": _ANNOTATION_PATH, "value": seen.network_status})
            ops.append({"op": "add", "path": _ANNOTATION_PATH, "value": value})
        else:  # the pod had no annotation: the map itself may be missing
            ops.append({"op": "test", "path": "/metadata/annotations", "value": None})
            ops.append(
                {
                    "op": "add",
                    "path": "/metadata/annotations",
                    "value": {NETWORK_STATUS_ANNOTATION: value},
                }
            )
        try:
            await self.api.json_patch(Pod, pod.name, ops, namespace=pod.namespace)
        except NotFound:
            self.written_interfaces.pop(pod, None)
            return True  # gone: nobody reads its networks any more
        except Invalid:
            self.patch_seen = False
            return False
        self._wrote(pod, statuses)
        return True


def _dumps(value: Any) -> str:
    return json.dumps(value)


def other_entries(current: str | None, ours: set[str], pod: ObjectRef) -> list[dict[str, Any]]:
    """The entries of a pod's network-status annotation that are not cnidra's interfaces. The
    annotation is tenant input: larger than ANNOTATION_MAX_BYTES, nested beyond the readers'
    bound, or not a list, it is not the spec's format and is replaced (so are items that are
    not objects)."""
    if not current:
        return []
    if len(current) > ANNOTATION_MAX_BYTES:
        log.warning(
            "network-status of pod %s/%s is %d bytes, over %d: replaced",
            pod.namespace, pod.name, len(current), ANNOTATION_MAX_BYTES,
        )  # fmt: skip
        return []
    try:
        loaded = load_json(current, "network-status annotation")
    except LoadError as exc:
        log.warning("network-status of pod %s/%s replaced: %s", pod.namespace, pod.name, exc)
        return []
    if not isinstance(loaded, list):
        return []
    return [e for e in loaded if isinstance(e, dict) and e.get("interface") not in ours]
