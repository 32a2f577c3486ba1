"""Background tasks that are watched: a task that dies is logged and restarted with backoff, and
/healthz turns red while a critical one is down, instead of a silent corpse in a list."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from cnidra.observe import metrics
from cnidra.util.backoff import Backoff

log = logging.getLogger(__name__)


@dataclass
class TaskState:
    name: str
    critical: bool
    running: bool = False
    restarts: int = 0
    last_error: str | None = None
    since: float = field(default_factory=time.time)


class Supervisor:
    def __init__(self, backoff: Callable[[], Backoff] = Backoff) -> None:
        self._backoff = backoff
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.states: dict[str, TaskState] = {}

    def spawn(
        self, name: str, run: Callable[[], Awaitable[None]], *, critical: bool = True
    ) -> None:
        """Run `run()` until stopped; restart it whenever it returns or raises."""
        state = TaskState(name, critical)
        self.states[name] = state
        self._tasks[name] = asyncio.create_task(self._keep(state, run), name=name)

    async def _keep(self, state: TaskState, run: Callable[[], Awaitable[None]]) -> None:
        backoff = self._backoff()
        while True:
            state.running, state.since = True, time.time()
            try:
                await run()
                state.last_error = "returned"
                log.error("background task %s returned; restarting it", state.name)
            except asyncio.CancelledError:
                state.running = False
                raise
            except Exception as exc:
                state.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("background task %s died; restarting it", state.name)
            state.running = False
            state.restarts += 1
            metrics.TASK_RESTARTS.labels(state.name).inc()
            await asyncio.sleep(backoff.next())

    def healthy(self) -> bool:
        return all(s.running for s in self.states.values() if s.critical)

    def report(self) -> dict[str, dict[str, object]]:
        return {
            s.name: {"running": s.running, "restarts": s.restarts, "lastError": s.last_error}
            for s in self.states.values()
        }

    async def stop(self) -> None:
        """Cancel every task and wait for it; an error while stopping is logged, not lost."""
        for task in self._tasks.values():
            task.cancel()
        for name, task in self._tasks.items():
            with contextlib.suppress(asyncio.CancelledError):
                try:
                    await task
                except Exception:
                    log.exception("background task %s failed while stopping", name)
        self._tasks.clear()
