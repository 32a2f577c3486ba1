"""Executing one plugin binary the way the CNI spec says: environment, stdin, stdout, exit code."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cnidra.api.netconf import plugin_type_problem
from cnidra.cni.errors import (
    InvalidPluginType,
    PluginError,
    PluginNotFound,
    PluginOutputError,
    PluginTimeout,
)

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 30.0


@dataclass(frozen=True)
class Invocation:
    command: str
    container_id: str = ""
    netns: str = ""
    if_name: str = ""
    cni_args: str = ""

    def environment(self, cni_path: Sequence[str], base: Mapping[str, str]) -> dict[str, str]:
        env = {k: v for k, v in base.items() if not k.startswith("CNI_")}
        env.update(
            {
                "CNI_COMMAND": self.command,
                "CNI_CONTAINERID": self.container_id,
                "CNI_NETNS": self.netns,
                "CNI_IFNAME": self.if_name,
                "CNI_ARGS": self.cni_args,
                "CNI_PATH": os.pathsep.join(cni_path),
            }
        )
        return env


@dataclass(frozen=True)
class Deadline:
    """When a group of plugin calls must be done, on the event loop's clock: a pod's ADDs must
    fit in the runtime's hook timeout, so each plugin gets what is left, not a fixed timeout."""

    at: float
    budget: float
    what: str = "the attach budget"

    @classmethod
    def after(cls, seconds: float, what: str = "the attach budget") -> Deadline:
        return cls(asyncio.get_running_loop().time() + seconds, seconds, what)

    def remaining(self) -> float:
        return self.at - asyncio.get_running_loop().time()

    def describe(self) -> str:
        return f"{self.what} of {self.budget:g}s"


ExecObserver = Callable[[str, str, float], None]


class PluginExec:
    """Finds plugins on a CNI path and runs them with a timeout that kills the process group."""

    def __init__(
        self,
        cni_path: Sequence[str],
        timeout: float = DEFAULT_TIMEOUT,
        base_env: Mapping[str, str] | None = None,
        on_exec: ExecObserver | None = None,
    ) -> None:
        """`on_exec(plugin_type, command, seconds)` is told of every run that ended (metrics)."""
        self.cni_path = list(cni_path)
        self.timeout = timeout
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.on_exec = on_exec
        self._found: dict[str, str] = {}

    def find(self, plugin_type: str) -> str:
        problem = plugin_type_problem(plugin_type)
        if problem:
            raise InvalidPluginType(f"plugin type {problem}")
        cached = self._found.get(plugin_type)
        if cached and os.access(cached, os.X_OK):
            return cached
        for directory in self.cni_path:
            candidate = os.path.join(directory, plugin_type)
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                self._found[plugin_type] = candidate
                return candidate
        raise PluginNotFound(plugin_type, self.cni_path)

    async def run(
        self,
        plugin_type: str,
        invocation: Invocation,
        stdin: bytes,
        deadline: Deadline | None = None,
    ) -> Any:
        """Run the plugin; return its parsed stdout JSON (None when it printed nothing).
        It gets the exec timeout, or what is left before `deadline` if that is less."""
        path = self.find(plugin_type)
        limit, budget = self.timeout, ""
        if deadline is not None and deadline.remaining() < limit:
            limit, budget = deadline.remaining(), deadline.describe()
            if limit <= 0:
                raise PluginTimeout(plugin_type, invocation.command, 0, budget)
        env = invocation.environment(self.cni_path, self.base_env)
        started = time.perf_counter()
        proc = await _spawn(path, env)
        try:
            async with asyncio.timeout(limit):
                stdout, stderr = await proc.communicate(stdin)
        except TimeoutError:
            await _kill_group(proc)
            raise PluginTimeout(plugin_type, invocation.command, limit, budget) from None
        except BaseException:
            await _kill_group(proc)  # cancelled: leave no plugin running behind us
            raise
        if self.on_exec is not None:
            self.on_exec(plugin_type, invocation.command, time.perf_counter() - started)
        return _interpret(plugin_type, invocation.command, proc.returncode, stdout, stderr)


# how long a spawn cancelled from outside may take to finish before its process is killed
SPAWN_GRACE = 5.0


async def _spawn(path: str, env: Mapping[str, str]) -> asyncio.subprocess.Process:
    """The plugin's process, started where no cancellation reaches inside asyncio's spawn.
    CPython 3.11's `create_subprocess_exec`, cancelled while it connects the pipes, closes the
    transport and then waits for pipes that are never all connected: the task never ends (a
    benchmark's task, cancelled when a peer's plugin timed out, hung there for the rest of the
    run: unix_events.py:220, `await transp._wait()`). A hook's deadline is such a cancellation.
    So the spawn runs as its own task; a cancellation waits for it (bounded by SPAWN_GRACE),
    kills the plugin's process group, and goes on."""
    spawn = asyncio.ensure_future(
        asyncio.create_subprocess_exec(
            path,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env),
            start_new_session=True,
        )
    )
    try:
        return await asyncio.shield(spawn)
    except asyncio.CancelledError:
        done, _ = await asyncio.wait({spawn}, timeout=SPAWN_GRACE)
        if done and not spawn.cancelled() and spawn.exception() is None:
            await _kill_group(spawn.result())
        elif not done:
            log.warning("plugin %s still starting %.0f s after the call ended", path, SPAWN_GRACE)
            spawn.add_done_callback(_kill_when_started)
        raise


def _kill_when_started(spawn: asyncio.Future[asyncio.subprocess.Process]) -> None:
    if not spawn.cancelled() and spawn.exception() is None:
        _signal_group(spawn.result())


def _signal_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def _kill_group(proc: asyncio.subprocess.Process) -> None:
    _signal_group(proc)
    with contextlib.suppress(ProcessLookupError):
        await proc.wait()


def _interpret(plugin: str, command: str, code: int | None, stdout: bytes, stderr: bytes) -> Any:
    if code == 0:
        if stderr.strip():
            log.warning(
                "plugin %s %s wrote to stderr: %s",
                plugin,
                command,
                stderr.decode("utf-8", "replace").strip()[:400],
            )
        if not stdout.strip():
            return None
        try:
            return json.loads(stdout)
        except json.JSONDecodeError:
            raise PluginOutputError(
                plugin, command, "exited 0 but its output is not JSON", stdout, stderr, code
            ) from None
    try:
        error = json.loads(stdout) if stdout.strip() else None
    except json.JSONDecodeError:
        error = None
    if isinstance(error, dict) and isinstance(error.get("code"), int) and "msg" in error:
        return_code: int = error["code"]
        raise PluginError.create(
            plugin,
            command,
            return_code,
            str(error.get("msg", "")),
            str(error.get("details", "") or ""),
            stderr,
        )
    how = (
        f"exited with status {code}"
        if code is not None and code >= 0
        else f"killed by signal {-(code or 0)}"
    )
    raise PluginOutputError(
        plugin, command, f"{how} without a CNI error object", stdout, stderr, code
    )
