"""The CNI runtime: libcni's network-list operations, async, for Python.

runtime = CNIRuntime(cni_path=["/opt/cni/bin"], cache_dir="/var/lib/cni")
result = await runtime.add(netconf, RuntimeConf(container_id, netns, "net1"))
await runtime.delete(netconf, RuntimeConf(container_id, netns, "net1"))
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from cnidra.cni.cache import DEFAULT_CACHE_DIR, ResultCache
from cnidra.cni.errors import CNIRuntimeError, PluginOutputError
from cnidra.cni.invoke import DEFAULT_TIMEOUT, Deadline, ExecObserver, Invocation, PluginExec
from cnidra.cni.result import Result, ResultError
from cnidra.cni.types import GCAttachment, NetworkConfigList, RuntimeConf

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VersionInfo:
    cni_version: str
    supported_versions: tuple[str, ...]


class PluginFailed(CNIRuntimeError):
    """One plugin of a list failed; says which, wraps why."""

    def __init__(
        self, network: str, index: int, plugin: str, command: str, cause: CNIRuntimeError
    ) -> None:
        super().__init__(
            f"network {network!r}: plugin {plugin!r} (#{index}) failed {command}: {cause}"
        )
        self.network = network
        self.index = index
        self.plugin = plugin
        self.command = command
        self.cause = cause


class _NetworkLocks:
    """ADD/DEL/CHECK of a network share; GC of that network runs alone (the spec's rule)."""

    def __init__(self) -> None:
        self._cond: dict[str, asyncio.Condition] = {}
        self._users: dict[str, int] = {}
        self._gc: set[str] = set()

    def _condition(self, network: str) -> asyncio.Condition:
        return self._cond.setdefault(network, asyncio.Condition())

    @asynccontextmanager
    async def shared(self, network: str) -> AsyncIterator[None]:
        cond = self._condition(network)
        async with cond:
            await cond.wait_for(lambda: network not in self._gc)
            self._users[network] = self._users.get(network, 0) + 1
        try:
            yield
        finally:
            async with cond:
                self._users[network] -= 1
                cond.notify_all()

    @asynccontextmanager
    async def exclusive(self, network: str) -> AsyncIterator[None]:
        cond = self._condition(network)
        async with cond:
            await cond.wait_for(lambda: network not in self._gc and not self._users.get(network))
            self._gc.add(network)
        try:
            yield
        finally:
            async with cond:
                self._gc.discard(network)
                cond.notify_all()


class CNIRuntime:
    def __init__(
        self,
        cni_path: Sequence[str],
        cache_dir: str = DEFAULT_CACHE_DIR,
        timeout: float = DEFAULT_TIMEOUT,
        exec_: PluginExec | None = None,
        on_exec: ExecObserver | None = None,
    ) -> None:
        self.exec = exec_ or PluginExec(cni_path, timeout, on_exec=on_exec)
        self.cache = ResultCache(cache_dir)
        self._locks = _NetworkLocks()

    # ------------------------------------------------------------------ ADD / CHECK / DEL

    async def add(
        self, net: NetworkConfigList, rt: RuntimeConf, deadline: Deadline | None = None
    ) -> Result:
        """ADD each plugin in order, chaining prevResult; cache the final result."""
        rt.check()
        async with self._locks.shared(net.name):
            result: Result | None = None
            for index, plugin in enumerate(net.plugins):
                stdin = _plugin_stdin(net, plugin, result, rt)
                out = await self._run(net, index, "ADD", _invocation("ADD", rt), stdin, deadline)
                try:
                    result = Result.parse(out, net.cni_version)
                except ResultError as exc:
                    cause = PluginOutputError(
                        plugin["type"], "ADD", str(exc), json.dumps(out).encode(), b""
                    )
                    raise PluginFailed(net.name, index, plugin["type"], "ADD", cause) from None
                result = result.as_version(net.cni_version)
            assert result is not None
            self.cache.store(net.name, rt, net.raw, result)
            return result

    async def check(self, net: NetworkConfigList, rt: RuntimeConf) -> None:
        """CHECK each plugin with the cached result (skipped when disableCheck)."""
        if not net.at_least("0.4.0"):
            raise CNIRuntimeError(
                f"CHECK needs cniVersion 0.4.0 or later; network {net.name!r} is {net.cni_version}"
            )
        if net.disable_check:
            return
        rt.check()
        cached = self.cached_result(net, rt)
        if cached is None:
            raise CNIRuntimeError(
                f"network {net.name!r}: no cached result for container "
                f"{rt.container_id} {rt.if_name}; nothing to CHECK"
            )
        async with self._locks.shared(net.name):
            for index, plugin in enumerate(net.plugins):
                stdin = _plugin_stdin(net, plugin, cached, rt)
                await self._run(net, index, "CHECK", _invocation("CHECK", rt), stdin)

    async def delete(
        self, net: NetworkConfigList, rt: RuntimeConf, deadline: Deadline | None = None
    ) -> None:
        """DEL each plugin in reverse with the cached result as prevResult; then drop the cache."""
        rt.check()
        async with self._locks.shared(net.name):
            await self._delete_locked(net, rt, deadline)

    async def _delete_locked(
        self, net: NetworkConfigList, rt: RuntimeConf, deadline: Deadline | None = None
    ) -> None:
        cached = self.cached_result(net, rt) if net.at_least("0.4.0") else None
        for index in reversed(range(len(net.plugins))):
            stdin = _plugin_stdin(net, net.plugins[index], cached, rt)
            await self._run(net, index, "DEL", _invocation("DEL", rt), stdin, deadline)
        self.cache.remove(net.name, rt)

    def cached_result(self, net: NetworkConfigList, rt: RuntimeConf) -> Result | None:
        entry = self.cache.load(net.name, rt)
        if entry is None or entry.result is None:
            return None
        try:
            return Result.parse(entry.result, net.cni_version).as_version(net.cni_version)
        except ResultError as exc:
            log.warning(
                "ignoring unusable cached result of %s/%s: %s", net.name, rt.container_id, exc
            )
            return None

    # ------------------------------------------------------------------ STATUS / GC / VERSION

    async def status(self, net: NetworkConfigList) -> None:
        """STATUS of each plugin (cniVersion >= 1.1.0; earlier lists are assumed ready)."""
        if not net.at_least("1.1.0"):
            return
        for index, plugin in enumerate(net.plugins):
            stdin = _encode({**plugin, "name": net.name, "cniVersion": net.cni_version})
            await self._run(net, index, "STATUS", Invocation("STATUS"), stdin)

    async def gc(
        self, net: NetworkConfigList, valid: Iterable[GCAttachment], *, stale_cached: bool = True
    ) -> None:
        """libcni's GCNetworkList: DEL cached attachments of this network not in `valid`, then
        GC each plugin (>= 1.1.0). `stale_cached=False` skips the first step, for a caller
        whose own records, not a cache, say what it may delete (cnidra's driver).

        Errors are collected, not fatal, as the spec asks; they are raised together at the end.
        """
        if net.disable_gc:
            return
        valid = list(valid)
        keep = {(a.container_id, a.if_name) for a in valid}
        errors: list[Exception] = []
        async with self._locks.exclusive(net.name):
            for entry in list(self.cache.attachments()) if stale_cached else []:
                if entry.network != net.name or (entry.container_id, entry.if_name) in keep:
                    continue
                try:
                    await self._delete_locked(net, entry.runtime_conf())
                except CNIRuntimeError as exc:
                    errors.append(exc)
            if net.at_least("1.1.0"):
                attachments = [
                    a.to_json() for a in sorted(valid, key=lambda a: (a.container_id, a.if_name))
                ]
                for index, plugin in enumerate(net.plugins):
                    stdin = _encode(
                        {
                            **plugin,
                            "name": net.name,
                            "cniVersion": net.cni_version,
                            "cni.dev/valid-attachments": attachments,
                            "cni.dev/attachments": attachments,
                        }
                    )
                    try:
                        await self._run(net, index, "GC", Invocation("GC"), stdin)
                    except CNIRuntimeError as exc:
                        errors.append(exc)
        if errors:
            raise ExceptionGroup(f"GC of network {net.name!r} had {len(errors)} error(s)", errors)

    async def version(self, plugin_type: str) -> VersionInfo:
        out = await self.exec.run(
            plugin_type, Invocation("VERSION"), _encode({"cniVersion": "1.1.0"})
        )
        if not isinstance(out, dict) or not isinstance(out.get("supportedVersions"), list):
            raise PluginOutputError(
                plugin_type,
                "VERSION",
                "did not return supportedVersions",
                json.dumps(out).encode(),
                b"",
            )
        return VersionInfo(
            str(out.get("cniVersion", "")), tuple(str(v) for v in out["supportedVersions"])
        )

    async def validate(self, net: NetworkConfigList) -> list[str]:
        """libcni's ValidateNetworkList: every plugin exists and supports the list's version.
        Returns the capabilities the list declares."""
        problems: list[str] = []
        caps: set[str] = set()
        for plugin in net.plugins:
            try:
                info = await self.version(plugin["type"])
            except CNIRuntimeError as exc:
                problems.append(str(exc))
                continue
            if net.cni_version not in info.supported_versions:
                problems.append(
                    f"plugin {plugin['type']!r} does not support cniVersion "
                    f"{net.cni_version} (it supports {', '.join(info.supported_versions)})"
                )
            caps |= {k for k, v in (plugin.get("capabilities") or {}).items() if v is True}
        if problems:
            raise CNIRuntimeError("; ".join(problems))
        return sorted(caps)

    async def _run(
        self,
        net: NetworkConfigList,
        index: int,
        command: str,
        invocation: Invocation,
        stdin: bytes,
        deadline: Deadline | None = None,
    ) -> Any:
        plugin_type = net.plugins[index]["type"]
        try:
            return await self.exec.run(plugin_type, invocation, stdin, deadline)
        except CNIRuntimeError as exc:
            raise PluginFailed(net.name, index, plugin_type, command, exc) from exc


def _invocation(command: str, rt: RuntimeConf) -> Invocation:
    return Invocation(command, rt.container_id, rt.netns, rt.if_name, rt.cni_args)


def _plugin_stdin(
    net: NetworkConfigList, plugin: Mapping[str, Any], prev: Result | None, rt: RuntimeConf
) -> bytes:
    """The plugin's config with name, cniVersion, prevResult and runtimeConfig injected."""
    conf: dict[str, Any] = {**plugin, "name": net.name, "cniVersion": net.cni_version}
    if prev is not None:
        conf["prevResult"] = prev.to_json()
    declared = plugin.get("capabilities") or {}
    runtime_config = {
        cap: rt.capability_args[cap]
        for cap, on in declared.items()
        if on is True and cap in rt.capability_args
    }
    if runtime_config:
        conf["runtimeConfig"] = runtime_config
    return _encode(conf)


def _encode(data: Mapping[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()
