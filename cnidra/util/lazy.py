"""A package whose `__init__` runs only when something asks it for a name it defines.

Some libraries' `__init__` imports every part they have, so that `from lib import X` works
for any X: pyroute2's loads its conntrack, ethtool, ipset, ipvs, nl80211 and NDB modules
(some 70 modules, about 5 MiB resident) for a driver that reads links with `IPRoute` alone.
`defer_init("pyroute2")` puts the package in `sys.modules` with its path set but its
`__init__` not run: a submodule (`pyroute2.iproute`, or `from pyroute2 import config`)
imports as usual, and the first other name asked of the package itself (`from pyroute2 import
NetNS`, `pyroute2.IPRoute`) runs the real `__init__` then, so nothing that uses the library
another way sees a difference."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any


def defer_init(name: str) -> bool:
    """Whether the package's `__init__` was deferred (False: imported already, or not a
    package that can be)."""
    if name in sys.modules:
        return False
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return False
    module = importlib.util.module_from_spec(spec)
    loader = spec.loader

    def complete(attribute: str) -> Any:
        """A submodule, imported; any other name: the package's own `__init__`, run once."""
        if attribute.startswith("__"):
            raise AttributeError(attribute)  # copy, pickle and the import system probe these
        if importlib.util.find_spec(f"{name}.{attribute}") is not None:
            return importlib.import_module(f"{name}.{attribute}")
        del module.__dict__["__getattr__"]
        loader.exec_module(module)
        return getattr(module, attribute)

    module.__dict__["__getattr__"] = complete
    sys.modules[name] = module
    return True
