"""Errors of the CNI runtime. Plugin errors carry the spec's code, msg and details."""

from __future__ import annotations

from typing import Any, ClassVar


class CNIRuntimeError(Exception):
    """Anything that went wrong running a network configuration."""


class InvalidPluginType(CNIRuntimeError):
    pass


class PluginNotFound(CNIRuntimeError):
    def __init__(self, plugin: str, path: list[str]) -> None:
        super().__init__(f"plugin {plugin!r} not found in CNI path {':'.join(path) or '(empty)'}")
        self.plugin = plugin
        self.path = path


class PluginTimeout(CNIRuntimeError):
    def __init__(self, plugin: str, command: str, timeout: float, budget: str = "") -> None:
        if budget and timeout <= 0:
            message = f"plugin {plugin!r} was not started for {command}: {budget} was used up"
        elif budget:
            message = (
                f"plugin {plugin!r} did not finish {command} within {timeout:.2g}s, all that "
                f"was left of {budget}; its process group was killed"
            )
        else:
            message = (
                f"plugin {plugin!r} did not finish {command} within {timeout:g}s; "
                "its process group was killed"
            )
        super().__init__(message)
        self.plugin = plugin
        self.command = command
        self.timeout = timeout
        self.budget = budget


class PluginOutputError(CNIRuntimeError):
    """The plugin broke the protocol: garbage on stdout, or a failure without a JSON error."""

    def __init__(
        self,
        plugin: str,
        command: str,
        problem: str,
        stdout: bytes,
        stderr: bytes,
        exit_code: int | None = None,
    ) -> None:
        shown = []
        if stdout.strip():
            shown.append(f"stdout: {_clip(stdout)}")
        if stderr.strip():
            shown.append(f"stderr: {_clip(stderr)}")
        printed = "; ".join(shown) or "it printed nothing"
        super().__init__(f"plugin {plugin!r} {command}: {problem} ({printed})")
        self.plugin = plugin
        self.command = command
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr


class CacheError(CNIRuntimeError):
    pass


class PluginError(CNIRuntimeError):
    """An error object a plugin returned, per the CNI spec."""

    code: ClassVar[int] = 0
    by_code: ClassVar[dict[int, type[PluginError]]] = {}

    def __init__(
        self, plugin: str, command: str, code: int, msg: str, details: str = "", stderr: bytes = b""
    ) -> None:
        text = f"plugin {plugin!r} {command} failed with code {code}: {msg}"
        if details:
            text += f" ({details})"
        if stderr.strip():
            text += f"; stderr: {_clip(stderr)}"
        super().__init__(text)
        self.plugin = plugin
        self.command = command
        self.error_code = code
        self.msg = msg
        self.details = details

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        PluginError.by_code[cls.code] = cls

    @classmethod
    def create(
        cls, plugin: str, command: str, code: int, msg: str, details: str = "", stderr: bytes = b""
    ) -> PluginError:
        return cls.by_code.get(code, PluginError)(plugin, command, code, msg, details, stderr)


class IncompatibleCNIVersion(PluginError):
    code = 1


class UnsupportedField(PluginError):
    code = 2


class UnknownContainer(PluginError):
    code = 3


class InvalidEnvironmentVariables(PluginError):
    code = 4


class IOFailure(PluginError):
    code = 5


class DecodingFailure(PluginError):
    code = 6


class InvalidNetworkConfig(PluginError):
    code = 7


class TryAgainLater(PluginError):
    code = 11


class PluginNotAvailable(PluginError):
    """STATUS: the plugin cannot service ADD requests."""

    code = 50


class PluginNotAvailableLimitedConnectivity(PluginError):
    """STATUS: not available, and existing containers may have limited connectivity."""

    code = 51


def _clip(data: bytes, limit: int = 400) -> str:
    text = data.decode("utf-8", "replace").strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."
