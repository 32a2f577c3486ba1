"""What the NRI plugin calls: the lifecycle and the reconciler behind one face, with the hook
metrics and logs."""

from __future__ import annotations

import logging
import time

from cnidra._proto.nri.v1alpha1 import api_pb2 as nri
from cnidra.nri.lifecycle import AttachError, PodLifecycle, pod_ref
from cnidra.nri.reconcile import Reconciler
from cnidra.observe import metrics
from cnidra.state.sandboxes import State

log = logging.getLogger(__name__)


class PodHooks:
    def __init__(self, lifecycle: PodLifecycle, reconciler: Reconciler) -> None:
        self.lifecycle = lifecycle
        self.reconciler = reconciler

    def set_request_timeout(self, seconds: float) -> None:
        self.lifecycle.set_request_timeout(seconds)

    async def run_pod_sandbox(self, pod: nri.PodSandbox) -> None:
        start = time.perf_counter()
        try:
            count = await self.lifecycle.attach(pod)
        except AttachError:
            metrics.ATTACH_FAILURES.inc()
            raise
        finally:
            elapsed = time.perf_counter() - start
            metrics.HOOK_LATENCY.labels("RunPodSandbox").observe(elapsed)
        if count:
            log.info(
                "attached %d interface(s) to pod %s/%s in %.1f ms",
                count,
                pod.namespace,
                pod.name,
                elapsed * 1000,
            )

    async def create_container(self, pod: nri.PodSandbox) -> None:
        """Attach now if the sandbox's own hook was missed (started while not registered)."""
        record = self.lifecycle.store.get(pod.id)
        if record is not None and record.state is State.ADDED:
            return
        if self.lifecycle.checkpoint.for_pod(pod.uid):
            log.info("late attach for pod %s/%s at container creation", pod.namespace, pod.name)
            await self.run_pod_sandbox(pod)

    async def stop_pod_sandbox(self, pod: nri.PodSandbox) -> None:
        start = time.perf_counter()
        try:
            await self.lifecycle.detach(pod.id, pod_ref(pod), self.lifecycle.budget.answer_by())
        finally:
            metrics.HOOK_LATENCY.labels("StopPodSandbox").observe(time.perf_counter() - start)

    async def remove_pod_sandbox(self, pod: nri.PodSandbox) -> None:
        self.lifecycle.forget_sandbox(pod.id)
        await self.lifecycle.detach(pod.id, pod_ref(pod), self.lifecycle.budget.answer_by())

    async def synchronize(self, pods: list[nri.PodSandbox]) -> None:
        await self.reconciler.synchronize(pods)
