"""What the NRI plugin calls: the lifecycle and the reconciler behind one face, with the hook
metrics and logs."""

from __future__ import annotations

import asyncio
import logging
import time

from cnidra._proto.nri.v1alpha1 import api_pb2 as nri
from cnidra.nri.lifecycle import AttachError, PodLifecycle, pod_ref
from cnidra.nri.reconcile import Reconciler
from cnidra.observe import metrics
from cnidra.state.sandboxes import State

log = logging.getLogger(__name__)


class PodHooks:
    """`background`: the RunPodSandbox hook starts the pod's ADDs and answers at once; the
    pod's first CreateContainer hook waits for them (a container never starts without its
    interfaces). containerd runs the NRI hooks of all pods one at a time, under one lock, so
    ADDs done inside RunPodSandbox make a burst of pods queue behind each other's plugins;
    behind the sandbox they run side by side while kubelet gets each pod's containers ready."""

    def __init__(
        self, lifecycle: PodLifecycle, reconciler: Reconciler, *, background: bool = False
    ) -> None:
        self.lifecycle = lifecycle
        self.reconciler = reconciler
        self.background = background
        self._attaching: dict[str, asyncio.Task[None]] = {}  # sandbox id -> its ADDs

    def set_request_timeout(self, seconds: float) -> None:
        self.lifecycle.budget.set_request_timeout(seconds)

    async def run_pod_sandbox(self, pod: nri.PodSandbox) -> None:
        if not self.background or not self.lifecycle.checkpoint.for_pod(pod.uid):
            await self._attach(pod, "RunPodSandbox")
            return
        start = time.perf_counter()
        task = asyncio.create_task(
            self._attach(pod, "Attach", behind=True), name=f"attach-{pod.id[:12]}"
        )
        task.add_done_callback(_observed)
        self._attaching[pod.id] = task
        metrics.HOOK_LATENCY.labels("RunPodSandbox").observe(time.perf_counter() - start)

    async def _attach(self, pod: nri.PodSandbox, hook: str, *, behind: bool = False) -> None:
        """`hook` labels the latency metric; `behind`: no hook's answer waits on the ADDs."""
        start = time.perf_counter()
        try:
            count = await self.lifecycle.attach(pod, behind_sandbox=behind)
        finally:
            elapsed = time.perf_counter() - start
            metrics.HOOK_LATENCY.labels(hook).observe(elapsed)
        if count:
            log.info(
                "attached %d interface(s) to pod %s/%s in %.1f ms",
                count,
                pod.namespace,
                pod.name,
                elapsed * 1000,
            )

    async def create_container(self, pod: nri.PodSandbox) -> None:
        """Wait for the pod's ADDs started behind its sandbox; attach now if the sandbox's own
        hook was missed (started while not registered) or its ADDs failed (kubelet creates
        the container again, and each try attaches again)."""
        start = time.perf_counter()
        try:
            await self._ready(pod)
        finally:
            metrics.HOOK_LATENCY.labels("CreateContainer").observe(time.perf_counter() - start)

    async def _ready(self, pod: nri.PodSandbox) -> None:
        task = self._attaching.get(pod.id)
        if task is not None:
            try:
                async with asyncio.timeout(self.lifecycle.budget.answer_seconds):
                    await asyncio.shield(task)
            except TimeoutError:
                raise AttachError(
                    f"pod {pod.namespace}/{pod.name}: its interfaces are still being set up; "
                    "the container is created on the runtime's next try"
                ) from None
            finally:
                if task.done():
                    self._attaching.pop(pod.id, None)
            return
        record = self.lifecycle.store.get(pod.id)
        if record is not None and record.state is State.ADDED:
            return
        if self.lifecycle.checkpoint.for_pod(pod.uid):
            log.info("late attach for pod %s/%s at container creation", pod.namespace, pod.name)
            await self._attach(pod, "RunPodSandbox")

    async def stop_pod_sandbox(self, pod: nri.PodSandbox) -> None:
        self.lifecycle.sandbox_stopped(pod.id)
        self._stop_adding(pod.id)
        start = time.perf_counter()
        try:
            await self.lifecycle.detach(pod.id, pod_ref(pod), self.lifecycle.budget.answer_by())
        finally:
            metrics.HOOK_LATENCY.labels("StopPodSandbox").observe(time.perf_counter() - start)

    async def remove_pod_sandbox(self, pod: nri.PodSandbox) -> None:
        self._stop_adding(pod.id)
        self.lifecycle.forget_sandbox(pod.id)
        await self.lifecycle.detach(pod.id, pod_ref(pod), self.lifecycle.budget.answer_by())

    async def synchronize(self, pods: list[nri.PodSandbox]) -> None:
        await self.reconciler.synchronize(pods)

    def _stop_adding(self, sandbox_id: str) -> None:
        """The sandbox goes: ADDs still running behind it are cancelled (their plugins killed,
        the record left `adding` for the DELs), so the hook's detach, which waits for the
        sandbox's lock, is not held up for as long as they could take (the plugin timeout,
        beyond the runtime's hook timeout)."""
        task = self._attaching.pop(sandbox_id, None)
        if task is not None and not task.done():
            task.cancel()


def _observed(task: asyncio.Task[None]) -> None:
    """A background attach's failure is the pod's CreateContainer hook's to report (and is
    already an event and a log line): it must not also surface as an unretrieved exception."""
    if not task.cancelled():
        task.exception()
