"""The CNI runtime: libcni's API shape in async Python."""

from cnidra.cni.cache import ResultCache
from cnidra.cni.errors import CNIRuntimeError, PluginError, PluginNotFound, PluginTimeout
from cnidra.cni.result import Result
from cnidra.cni.runtime import CNIRuntime, PluginFailed, VersionInfo
from cnidra.cni.types import GCAttachment, NetworkConfigList, RuntimeConf

__all__ = [
    "CNIRuntime",
    "CNIRuntimeError",
    "GCAttachment",
    "NetworkConfigList",
    "PluginError",
    "PluginFailed",
    "PluginNotFound",
    "PluginTimeout",
    "Result",
    "ResultCache",
    "RuntimeConf",
    "VersionInfo",
]
